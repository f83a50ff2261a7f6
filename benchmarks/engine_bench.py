"""The engine alone, offline (no server): how fast it generates, and how much of each step is
the engine loop rather than the model.

`--num-requests` requests of `--prompt-len` random token ids each (distinct, so no prefix-cache
hits) generate exactly `--output-len` tokens (EOS ignored, greedy) through an in-process
`LLMEngine` that runs up to `--concurrency` of them at once. A wrapper around the runner's
`run` times the model of every step (building its input tensors, the forward pass, sampling);
nothing is added to the engine.

- generated_tok_s: output tokens / the wall time of all steps (prefill included);
- prefill_ms_per_step: mean wall time of the steps that compute prompt tokens;
- decode_ms_per_step: mean wall time of the decode-only steps;
- loop_ms_per_step: per step, its wall time minus the runner's (scheduling, block accounting,
  detokenization, stop checks, step telemetry): mean and p50 over decode-only steps (the
  steady state), and the mean over all steps;
- forward_ms_per_step: the runner's time, over decode-only steps.

`--model null` has no forward pass, so its figures are the engine loop's alone.
A warm-up request runs first, untimed.

`--lane-ab ROUNDS`: the cost of the engine lane (`StepLane` on every step record). Two engines, one
with the lane and one without, run the same batch alternately ROUNDS times each (the order flips every
round); reported per side: the median over rounds of the mean engine-loop ms per step (wall minus the
runner's) and of the mean step wall ms, and `lane_loop_cost_pct`, `lane_step_cost_pct`: on vs off
(the issue's target: loop cost <= 2 %).

Usage: python benchmarks/engine_bench.py --model null --concurrency 256 --prompt-len 256 --output-len 256
(progress on stderr, one JSON object on stdout)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_llm.server.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

PROGRESS_INTERVAL_S = 2.0


def log(msg: str) -> None:
    print(f"[engine_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class TimedRunner:
    """Wraps `runner.run`: the seconds of its last call, and whether that call computed prompt tokens."""

    def __init__(self, runner):
        self._run = runner.run
        self.last_s = 0.0
        self.last_prefill = False
        runner.run = self

    def __call__(self, seqs, num_new_tokens, blocks_to_copy, sample_rows):
        t0 = time.perf_counter()
        token_ids = self._run(seqs, num_new_tokens, blocks_to_copy, sample_rows)
        self.last_s = time.perf_counter() - t0
        # outside the timed span, which this scan would inflate; `run` does not advance the sequences
        self.last_prefill = any(n > 1 for n in num_new_tokens) or any(
            seq.num_computed_tokens < seq.num_prompt_tokens for seq in seqs)
        return token_ids


def build_engine(args) -> LLMEngine:
    max_model_len = args.prompt_len + args.output_len
    blocks_per_seq = -(-max_model_len // args.block_size)
    return LLMEngine(EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.concurrency,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        num_kv_blocks=(args.concurrency + 1) * blocks_per_seq, max_model_len=max_model_len,
        log_stats=args.log_stats, num_threads=args.num_threads, engine_lane=args.engine_lane,
    ))


def prompts(engine: LLMEngine, count: int, length: int, seed: int) -> list[list[int]]:
    """Distinct random prompts of byte-range ids (every model's vocabulary has them), no EOS."""
    rng = random.Random(seed)
    eos = engine.eos_token_ids
    pool = [t for t in range(256) if t not in eos]
    return [[rng.choice(pool) for _ in range(length)] for _ in range(count)]


def run(engine: LLMEngine, timer: TimedRunner, batch: list[list[int]], output_len: int) -> dict:
    """Step `batch` to completion; per-step (wall_s, runner_s, prefill) and the output token count."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for rid, ids in enumerate(batch):
        engine.add_request(rid, ids, params)
    steps: list[tuple[float, float, bool]] = []
    generated = 0
    last_log = time.monotonic()
    while engine.has_unfinished():
        timer.last_s, timer.last_prefill = 0.0, False
        t0 = time.perf_counter()
        out = engine.step()
        steps.append((time.perf_counter() - t0, timer.last_s, timer.last_prefill))
        generated += sum(len(o.new_token_ids) for o in out.outputs)
        if time.monotonic() - last_log >= PROGRESS_INTERVAL_S:
            last_log = time.monotonic()
            log(f"{len(steps)} steps, {generated} tokens")
    return {"steps": steps, "generated": generated}


def summarize(args, steps: list[tuple[float, float, bool]], generated: int) -> dict:
    decode = [(w, r) for w, r, prefill in steps if not prefill]
    prefill = [w for w, _, p in steps if p]
    ms = 1e3

    def mean(xs):
        return round(statistics.fmean(xs) * ms, 4) if xs else None

    def p50(xs):
        return round(statistics.median(xs) * ms, 4) if xs else None

    loop_decode = [w - r for w, r in decode]
    return {
        "generated_tok_s": round(generated / sum(w for w, _, _ in steps), 1),
        "generated_tokens": generated,
        "num_steps": len(steps),
        "num_prefill_steps": len(prefill),
        "num_decode_steps": len(decode),
        "prefill_ms_per_step": mean(prefill),
        "decode_ms_per_step": mean([w for w, _ in decode]),
        "forward_ms_per_step": mean([r for _, r in decode]),
        "loop_ms_per_step": {"decode_mean": mean(loop_decode), "decode_p50": p50(loop_decode),
                             "all_mean": mean([w - r for w, r, _ in steps])},
        "config": {
            "model": args.model, "device": args.device, "dtype": args.dtype, "concurrency": args.concurrency,
            "prompt_len": args.prompt_len, "output_len": args.output_len, "num_requests": args.num_requests,
            "max_num_batched_tokens": args.max_num_batched_tokens, "block_size": args.block_size,
            "log_stats": args.log_stats, "torch_threads": torch.get_num_threads(), "cpu_cores": os.cpu_count(),
        },
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="null", help="dummy | null | smollm2 | a Hugging Face Llama directory")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--concurrency", type=int, default=64, help="max_num_seqs: sequences run at once")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-requests", type=int, default=None, help="default: --concurrency")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads (default: the engine's)")
    parser.add_argument("--log-stats", action=argparse.BooleanOptionalAction, default=True,
                        help="the engine's step telemetry (the server's default: on)")
    parser.add_argument("--engine-lane", action=argparse.BooleanOptionalAction, default=True,
                        help="the engine lane on every step record (the server's default: on)")
    parser.add_argument("--lane-ab", type=int, default=0, metavar="ROUNDS",
                        help="measure the lane's cost: lane on vs off, alternating, ROUNDS runs each")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.num_requests = args.num_requests or args.concurrency
    for name in ("concurrency", "prompt_len", "output_len", "num_requests"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    return args


def lane_ab(args) -> dict:
    """The lane's cost: on vs off, alternating rounds on two engines (see the module docstring)."""
    engines = {}
    for on in (True, False):
        args.engine_lane = on
        engine = build_engine(args)
        timer = TimedRunner(engine.runner)
        run(engine, timer, prompts(engine, 1, min(args.prompt_len, 16), args.seed + 1), min(args.output_len, 4))
        engines[on] = (engine, timer)
    batch = prompts(engines[True][0], args.num_requests, args.prompt_len, args.seed)
    loop: dict[bool, list[float]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.lane_ab):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            engine, timer = engines[on]
            steps = run(engine, timer, batch, args.output_len)["steps"]
            loop[on].append(statistics.fmean(w - t for w, t, _ in steps))
            wall[on].append(statistics.fmean(w for w, _, _ in steps))
        log(f"round {r + 1}/{args.lane_ab}: loop ms/step on {loop[True][-1] * 1e3:.4f}, off {loop[False][-1] * 1e3:.4f}")

    def side(on: bool) -> dict:
        return {"loop_ms_per_step": round(statistics.median(loop[on]) * 1e3, 4),
                "step_ms": round(statistics.median(wall[on]) * 1e3, 4)}

    on, off = side(True), side(False)
    return {
        "lane_on": on, "lane_off": off,
        "lane_loop_cost_pct": round((on["loop_ms_per_step"] / off["loop_ms_per_step"] - 1) * 100, 2),
        "lane_step_cost_pct": round((on["step_ms"] / off["step_ms"] - 1) * 100, 2),
        "rounds": args.lane_ab,
        "config": {"model": args.model, "device": args.device, "concurrency": args.concurrency,
                   "prompt_len": args.prompt_len, "output_len": args.output_len, "num_requests": args.num_requests,
                   "torch_threads": torch.get_num_threads()},
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.lane_ab:
        print(json.dumps(lane_ab(args), indent=2))
        return
    engine = build_engine(args)
    timer = TimedRunner(engine.runner)
    log(f"{args.model} on {args.device}: warm-up")
    warm = run(engine, timer, prompts(engine, 1, min(args.prompt_len, 16), args.seed + 1), min(args.output_len, 4))
    assert warm["generated"] == min(args.output_len, 4)
    log(f"{args.num_requests} requests x ({args.prompt_len} prompt + {args.output_len} output) tokens, "
        f"{args.concurrency} at once")
    result = run(engine, timer, prompts(engine, args.num_requests, args.prompt_len, args.seed), args.output_len)
    assert result["generated"] == args.num_requests * args.output_len, result["generated"]
    print(json.dumps(summarize(args, result["steps"], result["generated"]), indent=2))


if __name__ == "__main__":
    main()
