"""The Prometheus scrape receiver: pull any Prometheus or OpenMetrics `/metrics` into the store.

Each target has its own thread, so a refused, hanging or huge target never delays another.
Every `interval_s` it GETs the URL (bounded: `timeout_s` for the whole scrape, at most
`body_limit` bytes, at most `sample_limit` samples), converts the exposition to OTLP
(`scrape_convert`: families a profile knows go back to canonical instruments, so they come out
under any `--metrics-compat` profile; others keep their names) and ingests it under the
resource `service.name=<job>`, `service.instance.id=<host:port>`, which become the `job` and
`instance` labels, as Prometheus writes them. Each scrape also sets `up` (1 or 0),
`scrape_duration_seconds` and `scrape_samples_scraped` for the target; series the target no
longer exposes, and after a failed scrape every series but those, are removed at once (what
Prometheus's staleness markers do). Failures are counted by reason in
`otel_llm_scrape_failures_total{job,instance,reason}` and logged once per reason change.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from otel_llm.canonical.instruments import Kind
from otel_llm.collector.exporter.prometheus.exposition import SelfFamily
from otel_llm.collector.receiver.scrape_convert import Converter, ScrapeError
from otel_llm.collector.receiver.scrape_fetch import Fetcher
from otel_llm.export.exposition import label_text
from otel_llm.export.redaction import redact_url

logger = logging.getLogger("otel_llm.collector")

_JOB = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ScrapeTarget:
    url: str
    job: str = "scrape"
    interval_s: float = 15.0
    timeout_s: float = 10.0
    sample_limit: int = 50_000
    body_limit: int = 16 * 1024 * 1024
    labels: tuple[tuple[str, str], ...] = ()  # static labels: on the target's target_info series

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"scrape target {self.shown_url!r} is not an http(s)://host[:port]/path URL")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"scrape target {self.shown_url!r} has a bad port") from None
        if not _JOB.match(self.job):
            raise ValueError(f"job name {self.job!r} must match {_JOB.pattern}")
        if not 0 < self.timeout_s <= self.interval_s:
            raise ValueError(f"scrape timeout {self.timeout_s}s must be > 0 and <= the interval {self.interval_s}s")
        for name in ("sample_limit", "body_limit"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")

    @property
    def shown_url(self) -> str:
        """The URL for logs and thread names: no credentials."""
        return redact_url(self.url)

    @property
    def instance(self) -> str:
        """host:port, as Prometheus labels a target (the scheme's port when the URL has none)."""
        parts = urlsplit(self.url)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def parse_target(text: str, interval_s: float = 15.0, timeout_s: float | None = None) -> ScrapeTarget:
    """`[JOB=]URL` (e.g. `vllm=http://10.0.0.5:8000/metrics`); a bare host:port gets http:// and /metrics."""
    job, sep, url = text.partition("=")
    if not sep or not _JOB.match(job) or "://" in job:
        job, url = "scrape", text
    if "://" not in url:
        url = f"http://{url}"
    if not urlsplit(url).path:
        url += "/metrics"
    return ScrapeTarget(url, job, interval_s, min(10.0, interval_s) if timeout_s is None else timeout_s)


_PROM_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_DURATION_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|MB|GB|TB)?\s*$")
_SIZE_BYTES = {None: 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
_SCRAPE_KEYS = ("job_name", "scrape_interval", "scrape_timeout", "metrics_path", "scheme", "sample_limit",
                "body_size_limit", "static_configs")


def _duration(text, where: str) -> float:
    """A Prometheus duration ("15s", "1m30s", "500ms")."""
    text = str(text).strip()
    parts = _PROM_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{where}: {text!r} is not a duration (e.g. 15s, 1m30s, 500ms)")
    return sum(int(n) * _DURATION_S[u] for n, u in parts)


def load_scrape_config(path: str) -> list[ScrapeTarget]:
    """The targets of a prometheus.yml-style file: `global` (scrape_interval, scrape_timeout) and
    `scrape_configs` entries with the keys in _SCRAPE_KEYS; anything else is an error naming it."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("scrape_configs"), list):
        raise ValueError(f"{path}: no scrape_configs list")
    glob = doc.get("global") or {}
    interval = _duration(glob.get("scrape_interval", "15s"), f"{path}: global.scrape_interval")
    timeout = _duration(glob.get("scrape_timeout", "10s"), f"{path}: global.scrape_timeout")
    targets = []
    for i, sc in enumerate(doc["scrape_configs"]):
        where = f"{path}: scrape_configs[{i}]"
        if not isinstance(sc, dict) or "job_name" not in sc:
            raise ValueError(f"{where}: needs a job_name")
        unknown = sorted(set(sc) - set(_SCRAPE_KEYS))
        if unknown:
            raise ValueError(f"{where}: {', '.join(unknown)} not supported (supported: {', '.join(_SCRAPE_KEYS)})")
        job_interval = _duration(sc.get("scrape_interval", f"{interval:g}s"), f"{where}.scrape_interval")
        job_timeout = min(_duration(sc["scrape_timeout"], f"{where}.scrape_timeout") if "scrape_timeout" in sc
                          else timeout, job_interval)
        size = _SIZE.match(str(sc.get("body_size_limit", "16MB")))
        if size is None:
            raise ValueError(f"{where}.body_size_limit: {sc['body_size_limit']!r} is not a size (e.g. 16MB)")
        scheme, path_part = sc.get("scheme", "http"), sc.get("metrics_path", "/metrics")
        for static in sc.get("static_configs") or []:
            labels = tuple(sorted((str(k), str(v)) for k, v in (static.get("labels") or {}).items()))
            for host in static.get("targets") or []:
                try:
                    targets.append(ScrapeTarget(
                        f"{scheme}://{host}{path_part}", sc["job_name"], job_interval, job_timeout,
                        int(sc.get("sample_limit", 50_000)), int(size.group(1)) * _SIZE_BYTES[size.group(2)],
                        labels))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{where}: {exc}") from None
    return targets


class Scraper:
    """One target's scrape loop (its own thread)."""

    def __init__(self, target: ScrapeTarget, store, ingest=None) -> None:
        self.target = target
        self.store = store
        self._ingest = ingest or store.ingest  # payload -> IngestResult (the collector's: counted, forwarded)
        self.converter = Converter(target.job, target.instance, dict(target.labels), target.sample_limit)
        self.fetcher = Fetcher(target)  # its connection is kept between scrapes
        self.failures: dict[str, int] = {}
        self.scrapes = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"scrape {self.target.shown_url}", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop the loop; `wait`: for at most one scrape's time."""
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(self.target.timeout_s + 1)

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.scrape_once()
            except Exception:  # the loop must keep running
                logger.exception("scrape of %s failed unexpectedly", self.target.shown_url)
            next_at += self.target.interval_s
            now = time.monotonic()
            if next_at < now:  # a scrape overran the interval: skip the missed ones
                next_at = now + self.target.interval_s
            self._stop.wait(next_at - now)
        self.fetcher.close()

    def scrape_once(self) -> bool:
        """One scrape into the store; True when it succeeded."""
        t0 = time.monotonic()
        since = self.store.clock()
        now_ns = time.time_ns()
        error: ScrapeError | None = None
        try:
            text, openmetrics = self.fetcher.fetch()
            extra = {"up": 1.0, "scrape_duration_seconds": time.monotonic() - t0}
            payload = self.converter.convert(text, openmetrics, now_ns, extra)
        except ScrapeError as exc:
            error = exc
            payload = self.converter.up_only(now_ns, {"up": 0.0, "scrape_duration_seconds": time.monotonic() - t0,
                                                      "scrape_samples_scraped": 0.0})
        self._ingest(payload)
        if not self.converter.same_series:  # (a body of the last one's shape: every series there again)
            self.store.drop_unseen(self.converter.resource_key, since)
        with self._lock:
            self.scrapes += 1
            if error is not None:
                self.failures[error.reason] = self.failures.get(error.reason, 0) + 1
            message = "" if error is None else str(error)
            changed, self.last_error = message != self.last_error, message
        if changed:
            if error is None:
                logger.info("scrape of %s works again", self.target.shown_url)
            else:
                logger.warning("scrape of %s failed (%s): %s", self.target.shown_url, error.reason, error)
        return error is None


class ScrapeReceiver:
    def __init__(self, targets: tuple[ScrapeTarget, ...], store, ingest=None) -> None:
        self.scrapers = [Scraper(t, store, ingest) for t in targets]

    def start(self) -> None:
        for s in self.scrapers:
            s.start()

    def stop(self) -> None:
        for s in self.scrapers:  # all told first, so the waits overlap
            s.stop(wait=False)
        for s in self.scrapers:
            s.stop()

    def families(self) -> list[SelfFamily]:
        rows = []
        for s in self.scrapers:
            with s._lock:
                failures = dict(s.failures)
            for reason, n in sorted(failures.items()):
                rows.append((label_text((("job", s.target.job), ("instance", s.target.instance),
                                         ("reason", reason))), n))
        return [SelfFamily("otel_llm_scrape_failures", Kind.COUNTER,
                           "Failed scrapes by target and reason (timeout, unreachable, http_status, body_limit, "
                           "sample_limit, malformed).", tuple(rows))] if self.scrapers else []
