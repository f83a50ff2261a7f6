"""Per-step FLOP and memory-traffic estimate, exactly as vLLM 0.32 computes it for a dense Llama.

vLLM 0.32 counts ``vllm:estimated_flops_per_gpu_total``, ``vllm:estimated_read_bytes_per_gpu_total`` and
``vllm:estimated_write_bytes_per_gpu_total`` from an analytic model in ``vllm/v1/metrics/perf.py``:
``ModelMetrics.get_step_perf_stats_per_gpu`` folds the step's scheduled requests into an
``ExecutionContext`` and sums, over the components that apply to the model, the entries of
``get_num_flops_breakdown``, ``get_read_bytes_breakdown`` and ``get_write_bytes_breakdown``.
For a dense Llama (no MoE, no sliding window, no MLA, no quantization) on one GPU
(tensor and pipeline parallel size 1) the components are ``AttentionMetrics`` ("attn"),
``FfnMetrics`` ("ffn", its dense SwiGLU path) and ``UnembedMetrics`` ("unembed").

`PerfEstimator` folds those formulas' model constants into a few coefficients and keeps vLLM's
arithmetic where it matters for exactness: the attention entries multiply an integer by a float
layer count and truncate with ``int()`` one entry at a time (``AttentionMetrics._layer_counts``
returns floats), the FFN and unembed entries are pure integers. The results are therefore
bit-for-bit vLLM's, including past 2**53 where the float products round.

One deliberate difference: a step with nothing scheduled returns ``(0, 0, 0)``, where vLLM's empty
``ExecutionContext`` still bills the weight reads (the ``*_weight*`` entries, which do not depend on
the batch). Our engine does not run such steps; a caller that wants vLLM's figure for one adds
`PerfEstimator.weight_read_bytes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import mul


class PerfEstimator:
    """vLLM 0.32's per-GPU step estimate (vllm/v1/metrics/perf.py) for a dense Llama."""

    def __init__(self, num_layers: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 intermediate_size: int, vocab_size: int, weight_bytes: int, activation_bytes: int,
                 cache_bytes: int) -> None:
        """Model shape and byte sizes (weights, activations, KV cache), as vLLM's config parsers read them."""
        shape = {"num_layers": num_layers, "hidden_size": hidden_size, "num_heads": num_heads,
                 "num_kv_heads": num_kv_heads, "head_dim": head_dim, "intermediate_size": intermediate_size,
                 "vocab_size": vocab_size, "weight_bytes": weight_bytes, "activation_bytes": activation_bytes,
                 "cache_bytes": cache_bytes}
        for name, value in shape.items():
            if int(value) != value or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        L, D, q, kv, d = num_layers, hidden_size, num_heads, num_kv_heads, head_dim
        DI, V, wb, ab, cb = intermediate_size, vocab_size, weight_bytes, activation_bytes, cache_bytes
        Lf = float(L)  # AttentionMetrics._layer_counts: L, L_full (= L - 0.0) as floats
        self._layers = Lf

        # AttentionMetrics: each coefficient times a token count is the integer part of a vLLM entry,
        # which vLLM then multiplies by the float layer count and truncates.
        self._qkv_proj = 2 * D * (q + 2 * kv) * d  # flops qkv_proj: * T
        self._out_proj = 2 * D * q * d  # flops out_proj: * T
        self._attn_core = 2 * q * d  # flops attn_qk and attn_av: * sum(num_tokens * context_len)
        self._hidden_act = D * ab  # reads qkv_input, writes out_output: * T
        self._q_act = q * d * ab  # reads attn_input (queries), out_input: * tokens
        self._kv_act = 2 * kv * d * ab  # reads attn_input, prefill K/V: * prefill context_len sum
        self._kv_cache = 2 * kv * d * cb  # reads attn_input, decode K/V: * decode context_len sum; writes kv_cache: * T
        self._qkv_act = (q + 2 * kv) * d * ab  # writes qkv_output: * T
        attn_weights = int(D * (q + 2 * kv) * d * wb * Lf) + int(q * d * D * wb * Lf)  # qkv_weight + out_weight

        # FfnMetrics, dense path (num_moe_layers = 0): all integers, summed per T.
        self._ffn_flops = 2 * D * 3 * DI * L
        self._ffn_read = (D * ab + 2 * DI * ab + DI * ab) * L  # up_gate_input + silu_input + down_input
        self._ffn_write = (2 * DI * ab + DI * ab + D * ab) * L  # up_gate_output + silu_output + down_output
        ffn_weights = 2 * D * DI * wb * L + D * DI * wb * L  # up_gate_weights + down_weights

        # UnembedMetrics: per logits token (ExecutionContext.num_logits_tokens).
        self._unembed_flops = 2 * D * V
        self._unembed_read = D * ab
        self._unembed_write = V * ab
        unembed_weights = D * V * wb

        self.weight_read_bytes = attn_weights + ffn_weights + unembed_weights
        """The batch-independent part of the read bytes: every weight matrix, read once per step."""

    @classmethod
    def for_model(cls, config, dtype) -> PerfEstimator:
        """From a `LlamaConfig` and the torch dtype of weights, activations and the KV cache."""
        size = dtype.itemsize
        return cls(num_layers=config.num_layers, hidden_size=config.hidden_size, num_heads=config.num_heads,
                   num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                   intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
                   weight_bytes=size, activation_bytes=size, cache_bytes=size)

    def step(self, num_tokens: Sequence[int], context_lens: Sequence[int],
             is_prefill: Sequence[bool]) -> tuple[int, int, int]:
        """(flops, read_bytes, write_bytes) of one step. Per scheduled request: num_tokens[i] computed this step,
        context_lens[i] = tokens computed before this step + num_tokens[i], is_prefill[i] (vLLM's rule:
        a request scheduled for the first time, or a continuing one with num_tokens > 1).

        Requests with ``num_tokens == 0`` are left out, as ``get_step_perf_stats_per_gpu`` does; a step
        with no tokens returns ``(0, 0, 0)``.
        """
        if 0 in num_tokens:
            kept = [i for i, n in enumerate(num_tokens) if n]
            num_tokens = [num_tokens[i] for i in kept]
            context_lens = [context_lens[i] for i in kept]
            is_prefill = [is_prefill[i] for i in kept]
        # The ExecutionContext sums, with C-level builtins (faster than one Python-level pass).
        T = sum(num_tokens)
        if not T:
            return 0, 0, 0
        C = sum(context_lens)
        TC = sum(map(mul, num_tokens, context_lens))
        if any(is_prefill):
            n_prefill = sum(map(bool, is_prefill))
            Pt = sum(compress(num_tokens, is_prefill))
            Pc = sum(compress(context_lens, is_prefill))
        else:
            n_prefill = Pt = Pc = 0
        return self.estimate(T, C, TC, n_prefill, Pt, Pc)

    def estimate(self, T: int, C: int, TC: int, n_prefill: int = 0, Pt: int = 0, Pc: int = 0) -> tuple[int, int, int]:
        """`step` from the ExecutionContext's sums: tokens `T`, context lengths `C`, sum of tokens x context
        `TC`, and of the prefilling requests their number, tokens `Pt` and context lengths `Pc` (a
        decode-only step: T sequences of one token each, so TC == C)."""
        if not T:
            return 0, 0, 0
        Dt, Dc = T - Pt, C - Pc
        Lf = self._layers
        logits = n_prefill + Dt  # ExecutionContext.num_logits_tokens

        hidden = int(T * self._hidden_act * Lf)  # attn qkv_input == attn out_output
        attn_core = int(TC * self._attn_core * Lf)  # attn_qk == attn_av
        flops = (int(T * self._qkv_proj * Lf) + int(T * self._out_proj * Lf) + 2 * attn_core
                 + T * self._ffn_flops + logits * self._unembed_flops)

        attn_input = 0.0  # AttentionMetrics.get_read_bytes_breakdown accumulates this one in floats
        if Pt:
            attn_input += (Pt * self._q_act + Pc * self._kv_act) * Lf
        if Dt:
            attn_input += Dt * self._q_act * Lf + Dc * self._kv_cache * Lf
        read = (hidden + int(attn_input) + int(T * self._q_act * Lf) + T * self._ffn_read
                + logits * self._unembed_read + self.weight_read_bytes)

        write = (int(T * self._qkv_act * Lf) + int(T * self._kv_cache * Lf) + hidden
                 + T * self._ffn_write + logits * self._unembed_write)
        return flops, read, write
