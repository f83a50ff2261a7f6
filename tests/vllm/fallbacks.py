"""Run in a vLLM venv: the replace-mode logger on a vLLM that differs from every checked release.

`python fallbacks.py MODEL_DIR future-family`: vLLM's PrometheusStatLogger is patched to declare and
record one family otel-llm has never seen (as a newer release might). `python fallbacks.py MODEL_DIR
constructor-fails`: its constructor raises when handed otel-llm's metric classes. In both, otel-llm's
logger and vLLM's own get the same steps (vLLM's real stats classes); prints one JSON object: the
WARNING lines otel-llm logged, whether its exposition equals vLLM's own, and the OTLP side's counts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # stdout is the JSON alone
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def patch_vllm(scenario: str) -> None:
    from prometheus_client import Histogram
    from vllm.v1.metrics import loggers

    P = loggers.PrometheusStatLogger
    init, record = P.__init__, P.record

    if scenario == "future-family":
        def patched_init(self, vllm_config, engine_indexes=None):
            init(self, vllm_config, engine_indexes)
            name = vllm_config.model_config.served_model_name
            fam = self._counter_cls(name="vllm:future_steps", documentation="Steps seen by a newer vLLM.",
                                    labelnames=["model_name", "engine"])
            self.counter_future_steps = {i: fam.labels(name, str(i)) for i in self.engine_indexes}

        def patched_record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            record(self, scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)
            if iteration_stats is not None:
                self.counter_future_steps[engine_idx].inc()
        P.record = patched_record
    else:
        def patched_init(self, vllm_config, engine_indexes=None):
            if self._histogram_cls is not Histogram:
                raise TypeError("__new__() got an unexpected keyword argument 'native_histogram_bucket_factor'")
            init(self, vllm_config, engine_indexes)
    P.__init__ = patched_init


def main() -> None:
    model_dir, scenario = sys.argv[1], sys.argv[2]
    patch_vllm(scenario)
    from prometheus_client import REGISTRY
    from prometheus_client.exposition import generate_latest
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm_logger_bench import make_steps, same_samples, vllm_config

    from otel_llm.vllm.plugin import OtelLLMPrometheusStatLogger

    lines = Lines()
    logging.getLogger("vllm.otel_llm").addHandler(lines)
    cfg = vllm_config(model_dir)
    ours = OtelLLMPrometheusStatLogger(cfg, [0])  # first: vLLM's own logger then registers its families
    if ours.serving:
        theirs = PrometheusStatLogger(cfg, [0])

    class VllmOnly:
        def collect(self):
            for c in list(REGISTRY._collector_to_names):
                if getattr(c, "_name", "").startswith("vllm:") and c is not ours:
                    yield from c.collect()

    steps = make_steps("many", 40, 8)
    for sched, it, _, _ in steps:
        ours.record(scheduler_stats=sched, iteration_stats=it, mm_cache_stats=None, engine_idx=0)
        if ours.serving:
            theirs.record(scheduler_stats=sched, iteration_stats=it, mm_cache_stats=None, engine_idx=0)
    ours.log()
    vllms = generate_latest(VllmOnly()).decode()
    served = ours.render().decode() if ours.serving else vllms
    snap = ours._otel.agg.engines[0].snapshot()
    print(json.dumps({
        "warnings": lines.lines, "serving": ours.serving, "vllm_records": ours.vllm_records,
        "same_as_vllm": same_samples(vllms, served) if ours.serving else None,
        "served_future_steps": [ln for ln in served.splitlines() if ln.startswith("vllm:future_steps_total")],
        "vllm_success": sum(float(ln.rsplit(" ", 1)[1]) for ln in vllms.splitlines()
                            if ln.startswith("vllm:request_success_total")),
        "otlp_finished": int(snap.counters["otel_llm.request.finished"].sum()),
        "finished": sum(f for _, _, _, f in steps), "errors": ours._otel.agg.errors}))


if __name__ == "__main__":
    main()
