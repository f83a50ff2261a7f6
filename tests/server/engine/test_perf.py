"""`PerfEstimator` against vLLM 0.32's own estimate (vllm/v1/metrics/perf.py), run in vLLM's venv.

vLLM does not import in the project venv, so one subprocess under ``.venv-vllm/bin/python`` builds
vLLM's real ``AttentionMetrics``, ``FfnMetrics`` and ``UnembedMetrics`` with the field values its config
parsers give a dense Llama (tp = pp = 1, no MoE, no sliding window, no quantization), hands them to
``ModelMetrics.get_step_perf_stats_per_gpu`` with a stand-in ``SchedulerOutput`` per case, and prints
the per-GPU (flops, read bytes, write bytes). Every case must match exactly.
"""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch
from otel_llm.server.engine.perf import PerfEstimator
from otel_llm.server.model.dummy import dummy_config

from tests.vllm.harness import REPO, SERVER_ENV, VLLM_PY

SMOLLM2_135M = SimpleNamespace(num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64,
                               intermediate_size=1536, vocab_size=49152)

# vLLM's side: stdin is {"models": {name: fields}, "steps": {name: [[is_new, num_computed, num_scheduled], ...]}};
# stdout is {model: {step: [flops, read, write]}}, plus each model's read bytes of an empty step broken down.
VLLM_SCRIPT = r"""
import json, sys
from types import SimpleNamespace
from vllm.v1.metrics.perf import AttentionMetrics, FfnMetrics, ModelMetrics, UnembedMetrics

spec = json.load(sys.stdin)
out = {}
for name, m in spec["models"].items():
    base = dict(num_hidden_layers=m["L"], hidden_size=m["D"], num_attention_heads=m["q"], vocab_size=m["V"],
                weight_byte_size=m["wb"], activation_byte_size=m["ab"], dp_size=1, tp_size=1, pp_size=1,
                enable_ep=False)
    metrics = ModelMetrics.__new__(ModelMetrics)  # skip __init__: it parses a whole VllmConfig
    metrics.vllm_config = None
    metrics.metrics = [
        # BaseConfigParser + BaseAttentionConfigParser + SlidingWindowAttentionParser (no window)
        AttentionMetrics.model_validate(dict(base, num_key_value_heads=m["kv"], head_dim=m["d"],
                                             cache_byte_size=m["cb"], sliding_window=None, num_swa_layers=0)),
        # BaseConfigParser + FfnParallelParser + BaseFfnConfigParser for a config with no expert fields
        FfnMetrics.model_validate(dict(base, ffn_tp_size=1, ffn_ep_size=1, intermediate_size=m["DI"],
                                       num_experts=0, num_experts_per_tok=0, moe_intermediate_size=m["DI"],
                                       num_shared_experts=0, num_moe_layers=0)),
        UnembedMetrics.model_validate(base),
    ]
    results = out[name] = {}
    for step, reqs in spec["steps"].items():
        new = [SimpleNamespace(req_id=str(i), num_computed_tokens=c) for i, (is_new, c, n) in enumerate(reqs) if is_new]
        cached = [(str(i), c) for i, (is_new, c, n) in enumerate(reqs) if not is_new]
        sched = SimpleNamespace(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached],
                                                  num_computed_tokens=[c for _, c in cached]),
            num_scheduled_tokens={str(i): n for i, (_, _, n) in enumerate(reqs)},
        )
        stats = metrics.get_step_perf_stats_per_gpu(sched)
        results[step] = [stats.num_flops_per_gpu, stats.num_read_bytes_per_gpu, stats.num_write_bytes_per_gpu]
    from vllm.v1.metrics.perf import ExecutionContext
    breakdown = metrics.get_read_bytes_breakdown(ExecutionContext(), True)
    results["empty weight reads"] = sum(v for k, v in breakdown.items() if "weight" in k)
json.dump(out, sys.stdout)
"""

# Each request: [is_new (first scheduled this step), num_computed_tokens before the step, num_scheduled_tokens].
STEPS = {
    "empty": [],
    "decode x64": [[False, 1 + (i * 397) % 3000, 1] for i in range(64)],
    "long prefill": [[True, 0, 4096]],
    "prefill on a prefix-cache hit": [[True, 128, 300]],
    "chunked prefill continuing": [[False, 512, 256]],
    "mixed": ([[True, 0, 100], [False, 256, 64], [True, 0, 1], [False, 700, 0], [True, 32, 0]]
              + [[False, 20 + 13 * i, 1] for i in range(20)]),
    "past 2**53 (float rounding)": [[True, 0, 40_000_001], [False, 2_999_999, 1]],
}


def _estimators() -> dict[str, PerfEstimator]:
    return {
        f"{name} {dtype}": PerfEstimator.for_model(config(dtype), dtype)
        for name, config in (("SmolLM2-135M", lambda dtype: SMOLLM2_135M), ("dummy", dummy_config))
        for dtype in (torch.float32, torch.bfloat16)
    }


def _fields(name: str) -> dict[str, int]:
    """The shape back out of the model name, for vLLM's side."""
    config = SMOLLM2_135M if name.startswith("SmolLM2") else dummy_config(torch.float32)
    size = 4 if name.endswith("float32") else 2
    return {"L": config.num_layers, "D": config.hidden_size, "q": config.num_heads, "kv": config.num_kv_heads,
            "d": config.head_dim, "DI": config.intermediate_size, "V": config.vocab_size,
            "wb": size, "ab": size, "cb": size}


def _our_step(est: PerfEstimator, reqs) -> tuple[int, int, int]:
    """The caller's side of vLLM's rule: context = computed + scheduled; prefill = new or more than 1 token."""
    return est.step([n for _, _, n in reqs], [c + n for _, c, n in reqs], [new or n > 1 for new, _, n in reqs])


@pytest.fixture(scope="module")
def vllm_results() -> dict:
    if not VLLM_PY.exists():
        pytest.skip(f"vLLM's venv is not built ({VLLM_PY} is missing)")
    spec = {"models": {name: _fields(name) for name in _estimators()}, "steps": STEPS}
    proc = subprocess.run([str(VLLM_PY), "-c", VLLM_SCRIPT], input=json.dumps(spec), capture_output=True,
                          text=True, cwd=REPO, env={**SERVER_ENV, "PATH": "/usr/bin:/bin"}, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", list(_estimators()))
def test_matches_vllm(vllm_results, model):
    est = _estimators()[model]
    for step, reqs in STEPS.items():
        ours = _our_step(est, reqs)
        if step == "empty":
            # vLLM bills the weight reads even with nothing scheduled; the estimator returns zeros (documented).
            assert ours == (0, 0, 0)
            assert vllm_results[model][step] == [0, est.weight_read_bytes, 0]
            assert vllm_results[model]["empty weight reads"] == est.weight_read_bytes
        else:
            assert list(ours) == vllm_results[model][step], f"{model}, {step}"


def test_float_rounding_case_is_past_2_53():
    """The big case exercises vLLM's int-times-float rounding, not just integer arithmetic."""
    est = PerfEstimator.for_model(SMOLLM2_135M, torch.float32)
    flops = _our_step(est, STEPS["past 2**53 (float rounding)"])[0]
    assert flops > 2**53
    tc = 40_000_001 * 40_000_001 + 3_000_000  # sum(num_tokens * context_len)
    # attn_qk = int(2 * q * TC * d * 30.0): the float product rounds, so exact integers would be off
    assert int(tc * 2 * 9 * 64 * 30.0) != tc * 2 * 9 * 64 * 30


def test_all_zero_token_requests_are_an_empty_step():
    est = PerfEstimator.for_model(dummy_config(torch.float32), torch.float32)
    assert est.step([0, 0], [5, 9], [True, False]) == (0, 0, 0)
    assert est.step([], [], []) == (0, 0, 0)


def test_rejects_a_non_positive_shape():
    with pytest.raises(ValueError, match="num_kv_heads"):
        PerfEstimator(2, 128, 4, 0, 32, 256, 260, 4, 4, 4)
