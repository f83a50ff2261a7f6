"""vLLM-Omni's pipeline families: one table of names, kinds, HELP texts, labels and buckets.

Copied from vLLM-Omni 0.30's `vllm_omni/metrics/definitions.py`, `prometheus.py`, `modality.py`
and `transfer.py` (and checked against that release's wheel by the tests): the 15 families of
its Prometheus design (4 pipeline, 7 audio, 4 cross-stage transfer) and the 9 of its later
releases that a speech pipeline feeds (tokens, queue wait, failures, per-stage generation time,
in-queue time and waiting requests, speech streams). Its image, diffusion, realtime-VAD,
KV-connector and device-memory families have no source in a speech pipeline and are not here.
Names here are stems; the exposed name is `prefix + stem` (`vllm_omni:` by default, what
vLLM-Omni writes; `vllm:omni_` for its design's first release). Counters are named without
`_total`, which their samples take (as prometheus_client writes them).

Each family is also an OTel instrument (`otel`, `unit`: its OTLP metric, and its name under the
`otel` profile) whose attributes are the labels' `ATTRIBUTES`; a collector turns them back into
vLLM-Omni's names and labels (`otel_names` / `omni_names` go both ways).
"""

from __future__ import annotations

from typing import NamedTuple

from otel_llm.canonical.instruments import Kind
from otel_llm.shim.prometheus_naming import label_name, metric_name

PREFIXES = ("vllm_omni:", "vllm:omni_")  # vLLM-Omni's (the default), and its design's first release

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
REASON_LABELS = ("model_name", "reason")
STAGE_TYPE_LABELS = ("model_name", "stage", "stage_type")
STAGE_ONLY_LABELS = ("model_name", "stage")  # vLLM-Omni's DIFFUSION_LABELS

# The bounded label values: a request's failure (anything else is `unknown`), a speech stream's
# abort (anything else is `error`), a stage's type (vLLM-Omni's stage types)
FAILURE_REASONS = ("client_abort", "client_disconnect", "stage_error", "unknown")
STREAM_ABORT_REASONS = ("cancelled", "closed", "engine_dead", "error")
STAGE_TYPES = ("llm", "diffusion")


# The OTel attribute of each label (the same as on the pipeline's spans)
ATTRIBUTES = {
    "model_name": "gen_ai.request.model", "finished_reason": "otel_llm.finish_reason",
    "stage": "otel_llm.pipeline.stage", "replica": "otel_llm.pipeline.replica",
    "stage_type": "otel_llm.pipeline.stage_type", "reason": "otel_llm.pipeline.reason",
    "threshold_ms": "otel_llm.pipeline.audio.threshold_ms",
    "from_stage": "otel_llm.pipeline.from_stage", "from_replica": "otel_llm.pipeline.from_replica",
    "to_stage": "otel_llm.pipeline.to_stage", "to_replica": "otel_llm.pipeline.to_replica",
}


class PipelineFamily(NamedTuple):
    stem: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def otel(self) -> str:
        """Its OTel instrument's name."""
        return _OTEL[self.stem][0]

    @property
    def unit(self) -> str:
        """Its OTel instrument's UCUM unit."""
        return _OTEL[self.stem][1]

    @property
    def attributes(self) -> tuple[str, ...]:
        """Its labels' OTel attributes, in order."""
        return tuple(ATTRIBUTES[label] for label in self.labels)

    def exposed(self, otel: bool, prefix: str = PREFIXES[0]) -> tuple[str, tuple[str, ...]]:
        """Its Prometheus name (a counter's without `_total`) and label names, in order: vLLM-Omni's
        under `prefix`, or with `otel` its OTel instrument's as the OTel Prometheus rules write them."""
        if otel:
            return metric_name(self.otel, self.unit, self.kind), tuple(label_name(a) for a in self.attributes)
        return prefix + self.stem, self.labels


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

PROMPT_TOKENS = PipelineFamily("prompt_tokens", Kind.COUNTER,
                              "Total prompt (input) tokens processed across all pipeline stages.", PIPELINE_LABELS)
GENERATION_TOKENS = PipelineFamily("generation_tokens", Kind.COUNTER,
                                   "Total generation (output) tokens produced across all pipeline stages.",
                                   PIPELINE_LABELS)
QUEUE_WAIT = PipelineFamily("request_queue_wait_s", Kind.HISTOGRAM,
                            "Per-request queue wait between submit arrival and stage submit, in seconds.",
                            PIPELINE_LABELS, SECONDS_BUCKETS)
FAILED = PipelineFamily("requests_failed", Kind.COUNTER,
                        "Total requests by failure reason. Pairs with requests_success_total (abort bucket) to give "
                        "the full failure surface. Reasons are bounded to client_abort, client_disconnect, "
                        "stage_error, and unknown.", REASON_LABELS)
STAGE_GEN_TIME = PipelineFamily("stage_gen_time_s", Kind.HISTOGRAM,
                                "Per-stage generation time in seconds for diffusion / image stages.",
                                STAGE_TYPE_LABELS, SECONDS_BUCKETS)
STAGE_IN_QUEUE = PipelineFamily("stage_in_queue_s", Kind.HISTOGRAM,
                                "Time in seconds from diffusion scheduler enqueue to initial execution admission. "
                                "Zero is the healthy low-load baseline and is counted.", STAGE_ONLY_LABELS,
                                SECONDS_FAST_BUCKETS)
STAGE_WAITING = PipelineFamily("stage_waiting_requests", Kind.GAUGE,
                               "Sum of the latest scheduler waiting snapshots across a stage's replicas; diffusion "
                               "snapshots update when outputs arrive.", STAGE_ONLY_LABELS)
STREAM_COMPLETED = PipelineFamily("speech_stream_completed", Kind.COUNTER,
                                  "Speech audio generators that completed normally; does not confirm client receipt.",
                                  PIPELINE_LABELS)
STREAM_ABORTED = PipelineFamily("speech_stream_aborted", Kind.COUNTER,
                                "Speech audio generators terminated before normal completion, including before the "
                                "first PCM payload.", REASON_LABELS)

FAMILIES = (RUNNING, WAITING, SUCCESS, E2E, PROMPT_TOKENS, GENERATION_TOKENS, QUEUE_WAIT, FAILED,
            STAGE_GEN_TIME, STAGE_IN_QUEUE, STAGE_WAITING, STREAM_COMPLETED, STREAM_ABORTED,
            AUDIO_TTFP, AUDIO_DURATION, AUDIO_RTF, AUDIO_FRAMES, AUDIO_UNDERRUN, AUDIO_CONTINUITY_OK, AUDIO_SKIPPED,
            TRANSFER_SIZE, TRANSFER_TX, TRANSFER_RX, TRANSFER_IN_FLIGHT)

_OTEL = {  # stem -> (OTel instrument, unit)
    "num_requests_running": ("otel_llm.pipeline.requests.running", "{request}"),
    "num_requests_waiting": ("otel_llm.pipeline.requests.waiting", "{request}"),
    "requests_success": ("otel_llm.pipeline.requests.finished", "{request}"),
    "e2e_request_latency_s": ("otel_llm.pipeline.request.duration", "s"),
    "prompt_tokens": ("otel_llm.pipeline.tokens.prompt", "{token}"),
    "generation_tokens": ("otel_llm.pipeline.tokens.generation", "{token}"),
    "request_queue_wait_s": ("otel_llm.pipeline.request.queue_time", "s"),
    "requests_failed": ("otel_llm.pipeline.requests.failed", "{request}"),
    "stage_gen_time_s": ("otel_llm.pipeline.stage.generation_time", "s"),
    "stage_in_queue_s": ("otel_llm.pipeline.stage.queue_time", "s"),
    "stage_waiting_requests": ("otel_llm.pipeline.stage.waiting", "{request}"),
    "speech_stream_completed": ("otel_llm.pipeline.speech_streams.completed", "{stream}"),
    "speech_stream_aborted": ("otel_llm.pipeline.speech_streams.aborted", "{stream}"),
    "audio_ttfp_s": ("otel_llm.pipeline.audio.time_to_first_packet", "s"),
    "audio_duration_s": ("otel_llm.pipeline.audio.duration", "s"),
    "audio_rtf": ("otel_llm.pipeline.audio.real_time_factor", "1"),
    "audio_frames": ("otel_llm.pipeline.audio.frames", "{frame}"),
    "audio_underrun_s": ("otel_llm.pipeline.audio.underrun", "s"),
    "audio_continuity_ok": ("otel_llm.pipeline.audio.continuity_ok", "{request}"),
    "audio_skipped_requests": ("otel_llm.pipeline.audio.skipped", "{request}"),
    "transfer_size_bytes": ("otel_llm.pipeline.transfer.size", "By"),
    "transfer_tx_s": ("otel_llm.pipeline.transfer.tx_time", "s"),
    "transfer_rx_s": ("otel_llm.pipeline.transfer.rx_time", "s"),
    "transfer_in_flight_s": ("otel_llm.pipeline.transfer.in_flight_time", "s"),
}
BY_OTEL = {f.otel: f for f in FAMILIES}  # OTel instrument name -> family
