"""A two-stage pipeline's telemetry (vLLM-Omni's families): a stage-0 engine `Telemetry` with
(stage, replica) labels, the pipeline's own `PipelineTelemetry`, one `/metrics` for both, and one
audio request through both stages. Run: python docs_src/pipeline_sdk.py"""

import time
from array import array

from starlette.testclient import TestClient

from otel_llm import Telemetry, TelemetryConfig
from otel_llm.export.asgi import make_metrics_app
from otel_llm.pipeline import PipelineConfig, PipelineTelemetry, TransferHop

stage0 = Telemetry(TelemetryConfig(model_name="m", stage_replica=("0", "0")))  # vllm:* with stage/replica
pipeline = PipelineTelemetry(PipelineConfig(model_name="m"))  # enabled=False: nothing allocated or rendered
app = make_metrics_app([stage0], extra=pipeline.render)  # one /metrics for both (an ASGI app)

req = pipeline.arrival("chatcmpl-1", trace_headers=None, audio=True)  # a PipelineRequest
req.stage_started("0", "0")  # the thinker writes text ... (arrival to here: the request's queue wait)
now = time.monotonic_ns  # the pipeline's clock (PipelineTelemetry(clock=...))
t = now()
req.transfer(TransferHop("0", "0", "1", "1", 64, t, t + 1000, t + 2000, t + 3000))  # size, tx, in flight, rx
rows = array("q", [64, t, t + 1000, t + 2000, t + 3000] * 4)  # many hops on one edge: (size, tx0, tx1, rx0, rx1)
req.transfers(("0", "0", "1", "1"), rows)
req.stage_finished("0", "0")  # each visit that ends: its stage's generation time
req.stage_started("1", "1", queued_ns=t)  # ... the talker speaks it (enqueued at t: its in-queue time)
req.audio_chunk("1", "1", 4800)  # when a chunk's last byte went out: the first one observes TTFP
req.audio_chunk("1", "1", 4800)
req.stage_finished("1", "1")
req.finish("stop", prompt_tokens=12, generation_tokens=5)  # or req.fail("stage_error"), req.abort() (client gone)
pipeline.stage_waiting("1", "1", 0)  # a replica's scheduler snapshot (or watch_stage_waiting: read at every scrape)

text = pipeline.render(False).decode()
assert 'vllm_omni:requests_success_total{model_name="m",finished_reason="stop"} 1' in text
assert 'vllm_omni:transfer_size_bytes_count{model_name="m",from_stage="0",from_replica="0",to_stage="1",' \
       'to_replica="1"} 5' in text
assert 'vllm_omni:audio_ttfp_s_count{model_name="m",stage="1",replica="1"} 1' in text
assert 'vllm_omni:generation_tokens_total{model_name="m"} 5' in text
assert 'vllm_omni:stage_gen_time_s_count{model_name="m",stage="1",stage_type="llm"} 1' in text
served = TestClient(app).get("/metrics").text  # the stage engine's families, then the pipeline's
assert 'vllm:num_requests_running{model_name="m",stage="0",replica="0"}' in served and "vllm_omni:" in served
print("\n".join(line for line in text.splitlines() if line.startswith("vllm_omni:") and "_bucket" not in line))
