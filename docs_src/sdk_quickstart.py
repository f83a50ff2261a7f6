"""The SDK in one file: a toy engine loop records its steps with `StepRecorder`, the frontend feeds
them to `Telemetry`, and `/metrics` shows vLLM's names. Run: python docs_src/sdk_quickstart.py"""

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, StepRecorder, Telemetry, TelemetryConfig

tel = Telemetry(TelemetryConfig(model_name="my-model", max_model_len=8192))  # frontend (API process)
rec = StepRecorder()  # engine side: one per engine loop thread; importable without torch

# A request arrives at the frontend; the handle it gets back is the id the engine uses for it.
rids = [tel.arrival(RequestInfo(f"chatcmpl-{i}", prompt_tokens=37, operation="chat", max_tokens=4))
        for i in range(3)]

for step in range(4):  # the engine loop: one step after another
    if step == 0:
        for rid in rids:
            rec.queued(rid)  # entered the waiting queue
            rec.scheduled(rid, num_cached_tokens=32)  # (re)scheduled; prefix-cache hit in tokens
    rec.outputs(rids, 1)  # vectorised: every request that produced a token this step
    if step == 3:
        for rid in rids:
            rec.finished(rid, FinishReason.LENGTH)  # after its last output
    rec.snapshot(SchedulerSnapshot(running=3 if step < 3 else 0, waiting=0, kv_usage=0.31,
                                   prefix_queries=111 if step == 0 else 0, prefix_hits=96 if step == 0 else 0))
    payload: bytes = rec.end_step_bytes(15 if step == 0 else 0)  # one timestamp; the prompt tokens computed
    tel.ingest(payload)  # in the frontend, for every step, in order (it may cross a process boundary)

metrics = tel.render().decode()  # what /metrics serves (`tel.metrics_app` is the ASGI app)
assert 'vllm:request_success_total{model_name="my-model",engine="0",finished_reason="length"} 3.0' in metrics
assert 'vllm:time_to_first_token_seconds_count{model_name="my-model",engine="0"} 3' in metrics
assert 'vllm:generation_tokens_total{model_name="my-model",engine="0"} 12.0' in metrics
assert 'vllm:prefix_cache_hits_total{model_name="my-model",engine="0"} 96.0' in metrics
print("\n".join(line for line in metrics.splitlines() if line.startswith("vllm:") and "_bucket" not in line))
tel.shutdown()
