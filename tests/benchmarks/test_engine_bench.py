"""engine_bench on the null model: one JSON object that accounts for every step and token."""

import json

from benchmarks import engine_bench


def test_null_model_run_prints_the_figures(capsys):
    engine_bench.main(["--model", "null", "--device", "cpu", "--concurrency", "4", "--num-requests", "6",
                       "--prompt-len", "40", "--output-len", "5", "--max-num-batched-tokens", "64"])
    out = json.loads(capsys.readouterr().out)
    assert out["generated_tokens"] == 30
    assert out["num_steps"] == out["num_prefill_steps"] + out["num_decode_steps"]
    assert out["num_prefill_steps"] >= 4  # 6 x 40 prompt tokens, at most 64 per step
    for key in ("generated_tok_s", "prefill_ms_per_step", "decode_ms_per_step", "forward_ms_per_step"):
        assert out[key] >= 0
    assert set(out["loop_ms_per_step"]) == {"decode_mean", "decode_p50", "all_mean"}
    assert out["config"]["model"] == "null" and out["config"]["num_requests"] == 6
