"""float32 against bfloat16 for the default model on this machine: the measurement behind
what `--dtype auto` picks on CPU.

Per dtype, alternating within one run over ``--rounds`` rounds (a shared VM's speed drifts):
- startup_s: `otel-llm serve --model smollm2 --dtype D` from spawn to the first 200 from /health;
- decode_tok_s at batch 1 and ``--batch``: an in-process `LLMEngine` with the server's defaults
  (its threads, chunking, prefix caching; a smaller KV cache), that many chat prompts prefilled
  in one step, then the output tokens of the decode steps (``--max-tokens`` each, EOS ignored)
  per second of those steps;
- answers (first round only): the server's greedy (temperature 0) chat answers to PROMPTS,
  asked one at a time; ``paris``: whether the capital-of-France answer names Paris;
  ``same_as_float32``: how many answers are identical to float32's.
Medians over rounds, and every round's figure.

Usage: python benchmarks/dtype_bench.py [--rounds 3] [--batch 32] [--max-tokens 64]
(progress on stderr, one JSON object on stdout)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving.server_process import ManagedServer  # noqa: E402
from otel_llm.server.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

MODEL = "smollm2"
DTYPES = ("float32", "bfloat16")
PROMPTS = (
    "What is the capital of France?", "What is 12 times 7?", "Name three primary colors.",
    "Who wrote Romeo and Juliet?", "Translate 'good morning' into Spanish.",
    "What is the boiling point of water in Celsius?", "Give me a synonym for happy.",
    "What planet is known as the Red Planet?", "Write a haiku about the sea.", "How many legs does a spider have?",
    "What is the largest ocean on Earth?", "Explain what a CPU does in one sentence.",
    "What is the chemical symbol for gold?", "Who painted the Mona Lisa?", "List the first five prime numbers.",
    "What language is spoken in Brazil?", "What is the square root of 81?", "Tell me a fun fact about cats.",
    "What is the capital of Japan?", "Summarize the plot of Cinderella in one sentence.",
)
ANSWER_MAX_TOKENS = 32
_rids = itertools.count()


def log(msg: str) -> None:
    print(f"[dtype_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def chat(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def decode_tok_s(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> float:
    """Output tokens per second of the decode steps of `prompts` run together (the prefill step untimed)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for ids in prompts:
        engine.add_request(next(_rids), ids, params)
    first = engine.step()  # every prompt fits one step (max_num_batched_tokens 2048)
    assert all(len(o.new_token_ids) == 1 for o in first.outputs) and len(first.outputs) == len(prompts)
    generated, t0 = 0, time.perf_counter()
    while engine.has_unfinished():
        generated += sum(len(o.new_token_ids) for o in engine.step().outputs)
    return generated / (time.perf_counter() - t0)


def serve_and_ask(dtype: str, ask: bool) -> tuple[float, list[str] | None]:
    """Seconds from spawn to healthy, and (if `ask`) the server's greedy answers to PROMPTS."""
    t0 = time.perf_counter()
    server = ManagedServer(MODEL, telemetry_on=True, otlp_url=None, max_num_seqs=None, extra=["--dtype", dtype])
    try:
        server.wait_ready(timeout_s=300)
        startup_s = time.perf_counter() - t0
        if not ask:
            return startup_s, None
        answers = []
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for question in PROMPTS:
                body = {"model": MODEL, "messages": chat(question), "max_tokens": ANSWER_MAX_TOKENS, "temperature": 0}
                resp = client.post("/v1/chat/completions", json=body)
                resp.raise_for_status()
                answers.append(resp.json()["choices"][0]["message"]["content"])
        return startup_s, answers
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    engines = {dtype: LLMEngine(EngineConfig(model=MODEL, dtype=dtype, device="cpu", max_model_len=1024,
                                             num_kv_blocks=(args.batch + 1) * 1024 // 16))
               for dtype in DTYPES}
    tok = engines[DTYPES[0]].tokenizer
    prompts = [tok.encode(tok.apply_chat_template(chat(PROMPTS[i % len(PROMPTS)]))) for i in range(args.batch)]
    samples = {dtype: {"startup_s": [], "decode_tok_s_batch_1": [], f"decode_tok_s_batch_{args.batch}": []}
               for dtype in DTYPES}
    answers = {}
    for r in range(args.rounds):
        order = DTYPES if r % 2 == 0 else DTYPES[::-1]
        for dtype in order:
            s = samples[dtype]
            s["decode_tok_s_batch_1"].append(decode_tok_s(engines[dtype], prompts[:1], args.max_tokens))
            s[f"decode_tok_s_batch_{args.batch}"].append(decode_tok_s(engines[dtype], prompts, args.max_tokens))
            startup_s, got = serve_and_ask(dtype, ask=r == 0)
            s["startup_s"].append(startup_s)
            if got is not None:
                answers[dtype] = got
            log(f"round {r} {dtype}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in s.items()))

    result = {
        "model": MODEL,
        "cpu": {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "native_bf16": _cpu_flags() & {"avx512_bf16", "amx_bf16"} != set()},
        "rounds": args.rounds, "batch": args.batch, "max_tokens": args.max_tokens,
    }
    for dtype in DTYPES:
        result[dtype] = {
            **{name: round(statistics.median(v), 2) for name, v in samples[dtype].items()},
            "per_round": {name: [round(x, 2) for x in v] for name, v in samples[dtype].items()},
            "paris": "Paris" in answers[dtype][0],
            "same_as_float32": f"{sum(a == b for a, b in zip(answers[dtype], answers['float32']))}/{len(PROMPTS)}",
            "answers": answers[dtype],
        }
    print(json.dumps(result, indent=2, ensure_ascii=False))


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


if __name__ == "__main__":
    main()
