"""vLLM-Omni's pipeline families: one table of names, kinds, HELP texts, labels and buckets.

Copied from vLLM-Omni's `vllm_omni/metrics/definitions.py` (the release whose prefix is
`vllm:omni_`), `prometheus.py`, `modality.py` and `transfer.py`: the 15 families of its
Prometheus design (4 pipeline, 7 audio, 4 cross-stage transfer). Names here are stems; the
exposed name is `prefix + stem` (`vllm:omni_` by default; newer vLLM-Omni writes `vllm_omni:`).
Counters are named without `_total`, which their samples take (as prometheus_client writes them).
"""

from __future__ import annotations

from typing import NamedTuple

from otel_llm.canonical.instruments import Kind

PREFIXES = ("vllm:omni_", "vllm_omni:")  # the seed's release, and vLLM-Omni's later rename

SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
SECONDS_FAST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
RTF_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 5.0, 10.0)
BYTES_BUCKETS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456)

PIPELINE_LABELS = ("model_name",)
SUCCESS_LABELS = ("model_name", "finished_reason")
STAGE_LABELS = ("model_name", "stage", "replica")
CONTINUITY_LABELS = ("model_name", "stage", "replica", "threshold_ms")
SKIPPED_LABELS = ("model_name", "stage", "replica", "reason")
TRANSFER_LABELS = ("model_name", "from_stage", "from_replica", "to_stage", "to_replica")


class PipelineFamily(NamedTuple):
    stem: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


RUNNING = PipelineFamily("num_requests_running", Kind.GAUGE,
                         "Number of requests currently running across all pipeline stages.", PIPELINE_LABELS)
WAITING = PipelineFamily("num_requests_waiting", Kind.GAUGE, "Number of requests waiting to be scheduled.",
                         PIPELINE_LABELS)
SUCCESS = PipelineFamily("requests_success", Kind.COUNTER,
                         "Total requests by completion reason (stop / length / abort / ...). Aborts cover "
                         "client-disconnect / cancellation paths in addition to upstream FinishReason.ABORT.",
                         SUCCESS_LABELS)
E2E = PipelineFamily("e2e_request_latency_s", Kind.HISTOGRAM,
                     "Pipeline-global end-to-end request latency in seconds (user arrival to complete response).",
                     PIPELINE_LABELS, SECONDS_BUCKETS)

AUDIO_TTFP = PipelineFamily("audio_ttfp_s", Kind.HISTOGRAM,
                            "Time from request arrival to first audio packet/frame, in seconds.", STAGE_LABELS,
                            SECONDS_BUCKETS)
AUDIO_DURATION = PipelineFamily("audio_duration_s", Kind.HISTOGRAM,
                                "Generated audio content duration in seconds (audio_frames / sample_rate).",
                                STAGE_LABELS, SECONDS_BUCKETS)
AUDIO_RTF = PipelineFamily("audio_rtf", Kind.HISTOGRAM,
                           "Audio real-time factor (stage_gen_time_s / audio_duration_s); streaming TTS requires < 1.",
                           STAGE_LABELS, RTF_BUCKETS)
AUDIO_FRAMES = PipelineFamily("audio_frames", Kind.COUNTER,
                              "Cumulative audio frame count; per-model rate (not summable across models). "
                              "Throughput recovered via rate().", STAGE_LABELS)
AUDIO_UNDERRUN = PipelineFamily("audio_underrun_s", Kind.HISTOGRAM,
                                "Per-request worst-case player-deficit in seconds (max time the player ran out of "
                                "buffered audio). > 0 indicates listener experienced silent gaps.", STAGE_LABELS,
                                SECONDS_FAST_BUCKETS)
AUDIO_CONTINUITY_OK = PipelineFamily("audio_continuity_ok", Kind.COUNTER,
                                     "Incremented when the request's worst underrun stayed below threshold_ms. Pair "
                                     "with requests_success_total to compute streaming-continuity health rate.",
                                     CONTINUITY_LABELS)
AUDIO_SKIPPED = PipelineFamily("audio_skipped_requests", Kind.COUNTER,
                               "Silent-loss counter — code2wav rejected malformed codec input and returned 200 OK "
                               "with empty audio.", SKIPPED_LABELS)

TRANSFER_SIZE = PipelineFamily("transfer_size_bytes", Kind.HISTOGRAM,
                               "Per-transfer payload size in bytes (one observation per physical hop).",
                               TRANSFER_LABELS, BYTES_BUCKETS)
TRANSFER_TX = PipelineFamily("transfer_tx_s", Kind.HISTOGRAM,
                             "Sender-side time in seconds (serialize + submit to connector).", TRANSFER_LABELS,
                             SECONDS_FAST_BUCKETS)
TRANSFER_RX = PipelineFamily("transfer_rx_s", Kind.HISTOGRAM, "Receiver-side time in seconds (recv + deserialize).",
                             TRANSFER_LABELS, SECONDS_FAST_BUCKETS)
TRANSFER_IN_FLIGHT = PipelineFamily("transfer_in_flight_s", Kind.HISTOGRAM,
                                    "Network in-flight time in seconds (TX done -> RX recv start).", TRANSFER_LABELS,
                                    SECONDS_FAST_BUCKETS)

FAMILIES = (RUNNING, WAITING, SUCCESS, E2E,
            AUDIO_TTFP, AUDIO_DURATION, AUDIO_RTF, AUDIO_FRAMES, AUDIO_UNDERRUN, AUDIO_CONTINUITY_OK, AUDIO_SKIPPED,
            TRANSFER_SIZE, TRANSFER_TX, TRANSFER_RX, TRANSFER_IN_FLIGHT)
