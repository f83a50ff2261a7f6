"""Instrument your own engine with otel-llm: a toy continuous-batching engine (greedy decoding with a
torch bigram model) in its own thread calls `StepRecorder`; the frontend feeds `Telemetry`.

    python examples/custom_engine.py [--requests 16] [--otlp-metrics-endpoint http://127.0.0.1:4318]
                                     [--otlp-traces-endpoint http://127.0.0.1:4318]

Prints the request intervals it measured in vLLM's names (what /metrics would show); it also pushes
the metrics (e.g. to `otel-llm collector`) and the gen_ai spans (e.g. to Jaeger) over OTLP/HTTP.
"""

import argparse
import queue
import threading
from collections import deque

import torch

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.export.otlp_metrics import otlp_metric_reader, service_resource

VOCAB, EOS, MAX_BATCH = 96, 0, 4


class ToyEngine:
    """Your engine: FIFO admission into a batch of at most MAX_BATCH, one token per request per step."""

    def __init__(self, steps: queue.Queue):
        self.rec, self.steps = StepRecorder(), steps  # the recorder belongs to this engine thread
        self.model = torch.nn.Embedding(VOCAB, VOCAB)  # next-token logits from the last token
        self.inbox, self.waiting = queue.Queue(), deque()
        self.running: dict[int, list[int]] = {}  # rid -> [last token, tokens left]

    def loop(self, num_requests: int) -> None:
        done = 0
        while done < num_requests:
            while not self.inbox.empty() or not (self.waiting or self.running):
                self.waiting.append(self.inbox.get())
                self.rec.queued(self.waiting[-1][0])  # 1. entered the waiting queue
            prefill_tokens = 0
            while self.waiting and len(self.running) < MAX_BATCH:
                rid, prompt, max_tokens = self.waiting.popleft()
                self.running[rid] = [prompt[-1], max_tokens]
                self.rec.scheduled(rid)  # 2. scheduled (pass num_cached_tokens= for prefix-cache hits)
                prefill_tokens += len(prompt)
            rids = list(self.running)
            with torch.no_grad():
                next_tokens = self.model(torch.tensor([self.running[r][0] for r in rids])).argmax(-1).tolist()
            self.rec.outputs(rids, 1)  # 3. one call per step for the whole batch
            for rid, token in zip(rids, next_tokens):
                state = self.running[rid]
                state[0], state[1] = token, state[1] - 1
                if token == EOS or state[1] == 0:
                    self.rec.finished(rid, FinishReason.STOP if token == EOS else FinishReason.LENGTH)  # 4.
                    del self.running[rid]
                    done += 1
            self.rec.snapshot(SchedulerSnapshot(len(self.running), len(self.waiting), len(self.running) / MAX_BATCH))
            self.steps.put(self.rec.end_step_bytes(prefill_tokens))  # 5. one payload per step to the frontend
        self.steps.put(None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--otlp-metrics-endpoint", help="push metrics here (an OTLP/HTTP base URL)")
    parser.add_argument("--otlp-traces-endpoint", help="push spans here (an OTLP/HTTP base URL)")
    args = parser.parse_args(argv)
    tel = Telemetry(TelemetryConfig(model_name="toy-bigram", max_model_len=512, log_stats=False,
                                    tracing=bool(args.otlp_traces_endpoint),
                                    otlp_traces_endpoint=args.otlp_traces_endpoint))
    reader = None
    if args.otlp_metrics_endpoint:
        reader = otlp_metric_reader(args.otlp_metrics_endpoint, interval_s=3600)  # pushed at shutdown below
        tel.attach_reader(reader, service_resource("toy-engine"))
    engine = ToyEngine(steps := queue.Queue())
    thread = threading.Thread(target=engine.loop, args=(args.requests,), daemon=True)
    thread.start()
    for i in range(args.requests):  # the frontend: arrival returns the id the engine uses
        prompt = torch.randint(1, VOCAB, (8 + i % 5,)).tolist()
        rid = tel.arrival(RequestInfo(f"req-{i}", prompt_tokens=len(prompt), max_tokens=32))
        engine.inbox.put((rid, prompt, 32))
    while (step := steps.get()) is not None:
        tel.ingest(step)  # every step, in order
    thread.join()
    if reader is not None:
        reader.shutdown()  # collects and pushes once more
    tel.shutdown()  # flushes the spans
    wanted = ("vllm:request_success", "vllm:generation_tokens", "vllm:prompt_tokens", "vllm:time_to_first_token",
              "vllm:e2e_request_latency", "vllm:request_queue_time")
    print("\n".join(x for x in tel.render().decode().splitlines() if x.startswith(wanted) and "_bucket" not in x))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
