"""Run in the vLLM venv: vLLM's own PrometheusStatLogger and otel-llm's replace-mode logger get the same
`record_sleep_state` and `record_admission_rejection` calls (as vLLM's StatLoggerManager makes them);
after each, the two render the same `vllm:engine_sleep_state` and `vllm:admission_rejections_total`
samples. The add-mode logger takes the same calls without raising. Prints one JSON object."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # stdout is the JSON alone
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

FAMILIES = ("vllm:engine_sleep_state", "vllm:admission_rejections")
CALLS = [("sleep", 1, 1), ("rejection", "max_num_queued_reqs"), ("sleep", 1, 2), ("rejection", "max_num_queued_reqs"),
         ("rejection", "max_num_queued_tokens"), ("sleep", 0, 0)]  # vLLM's AsyncLLM reasons


def picked(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f"{s.name}{sorted(s.labels.items())}": s.value for fam in text_string_to_metric_families(text)
            if fam.name in FAMILIES for s in fam.samples if not s.name.endswith("_created")}


def main() -> None:
    from prometheus_client import REGISTRY
    from prometheus_client.exposition import generate_latest
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm_logger_bench import vllm_config

    from otel_llm.vllm.plugin import OtelLLMPrometheusStatLogger, OtelLLMStatLogger

    cfg = vllm_config(sys.argv[1])
    ours = OtelLLMPrometheusStatLogger(cfg, [0])  # first: vLLM's logger then registers its own families
    add = OtelLLMStatLogger(cfg, [0])
    theirs = PrometheusStatLogger(cfg, [0])

    class VllmOnly:
        def collect(self):
            for c in list(REGISTRY._collector_to_names):
                if getattr(c, "_name", "").startswith("vllm:"):
                    yield from c.collect()

    steps = []
    for call in [None, *CALLS]:
        if call is not None:
            for logger in (theirs, ours, add):
                if call[0] == "sleep":
                    logger.record_sleep_state(call[1], call[2])
                else:
                    logger.record_admission_rejection(call[1])
        want, got = picked(generate_latest(VllmOnly()).decode()), picked(ours.render().decode())
        steps.append({"call": call, "same": want == got, "vllm": want, "otel_llm": got})
    before = ours._otel.agg.errors
    ours.record_admission_rejection("no_such_reason")  # vLLM's own logger raises KeyError; ours never raises
    add.record_admission_rejection("no_such_reason")
    add.record_sleep_state(1, 1)
    print(json.dumps({"steps": steps, "unknown_reason_counted": ours._otel.agg.errors - before,
                      "add_mode_errors": add._otel.agg.errors}))


if __name__ == "__main__":
    main()
