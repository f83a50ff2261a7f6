"""A Prometheus or OpenMetrics exposition -> one OTLP ExportMetricsServiceRequest (the shim in reverse).

What each family becomes (canonical instruments for families a profile knows, their own names
for the rest, cumulative start times) is `scrape_plan`'s; this is one target's converter, which
keeps what a scrape can reuse from the last: the `Plan` built for the last body's families, and
that body's skeleton (`scrape_skeleton`: every line but the sample values). A text body with the
same skeleton (a target's usual scrape: only values moved) is not parsed: its values are read
off its lines and written into the plan's request. Any other body (new or gone series, changed
help or types, OpenMetrics, a value written unusually) is parsed by prometheus_client and gets a
new plan. Both ways give the same request, byte for byte, and raise the same errors.
"""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_llm.collector.receiver.scrape_plan import (  # noqa: F401  (Reverse, reverse_table: re-exported)
    Plan, Reverse, ScrapeError, Starts, add_gauges, request_for, reverse_table,
)
from otel_llm.collector.receiver.scrape_skeleton import Skeleton


def parse(text: str, openmetrics: bool):
    """prometheus_client's families, lazily (its parser raises ValueError on malformed text)."""
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    return text_string_to_metric_families(text)


class Converter:
    """One target's conversions; `starts` persists between its scrapes (series -> start ns, last value),
    and so do the last plan and skeleton. Not thread-safe: the target's scrape thread's."""

    def __init__(self, job: str, instance: str, extra_resource: dict[str, str] | None = None,
                 sample_limit: int = 50_000) -> None:
        attrs = {"service.name": job, "service.instance.id": instance, **(extra_resource or {})}
        self.resource = Resource(attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()])
        self.resource_key = self.resource.SerializeToString()
        self.sample_limit = sample_limit
        self.starts: dict[tuple, tuple[int, float]] = {}
        self.first_ns = 0
        self._plan: Plan | None = None
        self._skeleton: Skeleton | None = None  # the plan's body's, when a text body and plain
        # the last payload came from the plan before it (the body's shape unchanged): it holds every series
        # the one before it held, so none can have gone from the target
        self.same_series = False

    def convert(self, text: str, openmetrics: bool, now_ns: int, extra: dict[str, float]) -> bytes:
        """ExportMetricsServiceRequest bytes. `extra`: gauges to add (up, scrape_duration_seconds), and
        scrape_samples_scraped is added. Raises ScrapeError (malformed text, too many samples)."""
        if not self.first_ns:
            self.first_ns = now_ns
        values = None if openmetrics or self._skeleton is None else self._skeleton.values(text)
        self.same_series = False
        same = values is not None
        starts = Starts(self.starts, self.first_ns, {})
        try:
            if values is None:
                values = self._new_plan(text, openmetrics)
            self._plan.fill(values, now_ns, starts)
        except ScrapeError:
            raise
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # prometheus_client's parse errors
            raise ScrapeError("malformed", f"malformed exposition: {exc}") from None
        payload = self._plan.serialize({**extra, "scrape_samples_scraped": float(self._plan.samples)}, now_ns)
        self.starts = starts.now  # only the series still there
        self.same_series = same
        return payload

    def _new_plan(self, text: str, openmetrics: bool) -> list:
        """Parse `text` in full: a plan for its families (and its skeleton); -> its sample values."""
        families = []
        samples = 0
        for fam in parse(text, openmetrics):
            samples += len(fam.samples)
            if samples > self.sample_limit:
                raise ScrapeError("sample_limit", f"more than {self.sample_limit} samples (sample_limit)")
            families.append(fam)
        values = [s.value for fam in families for s in fam.samples]
        self._plan = Plan(self.resource, families)
        self._skeleton = None if openmetrics else Skeleton.of(text, values)
        return values

    def up_only(self, now_ns: int, extra: dict[str, float]) -> bytes:
        """A failed scrape: only `up` and the scrape_* gauges."""
        self.same_series = False
        request, sm = request_for(self.resource)
        add_gauges(sm, extra, now_ns)
        return request.SerializeToString()
