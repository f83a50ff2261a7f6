"""``dummy``: a tiny seeded random-weight Llama with a byte-level tokenizer.

Small enough that the engine's own overhead, not the matmuls, dominates on a
2-core CPU; the weights are scaled so greedy output depends on the prompt.
"""
from __future__ import annotations

import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from otel_llm.server.model.config import LlamaConfig, cast_weights, expected_weight_names
from otel_llm.server.model.tokenizer import Tokenizer

SEED = 1234
NUM_BYTES = 256
# Ids 0..255 are the bytes themselves; specials follow.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID, PAD_ID = range(NUM_BYTES, NUM_BYTES + len(SPECIAL_TOKENS))

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def dummy_config(dtype: torch.dtype) -> LlamaConfig:
    """The fixed shape of the dummy model."""
    return LlamaConfig(
        vocab_size=NUM_BYTES + len(SPECIAL_TOKENS),
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rope_theta=10000.0,
        rms_eps=1e-5,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=IM_START_ID,
        eos_token_ids=(IM_END_ID,),
        dtype=dtype,
    )


def dummy_weights(config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Seeded random weights: identical on every call and every machine.

    Matrices are N(0, 1/fan_in) so activations keep unit scale. The untied
    lm_head has gain 4, giving logits a standard deviation of about 3.5:
    greedy output follows the prompt, and EOS has a mean probability of about
    0.003 per step (greedy hits it within 64 tokens for roughly 1 prompt in 8).
    """
    gen = torch.Generator().manual_seed(SEED)
    h, hd = config.hidden_size, config.head_dim

    def matrix(rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * (gain / cols**0.5)

    weights = {"model.embed_tokens.weight": torch.randn(config.vocab_size, h, generator=gen)}
    for name in expected_weight_names(config):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(h)
        elif name.endswith("q_proj.weight"):
            weights[name] = matrix(config.num_heads * hd, h)
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            weights[name] = matrix(config.num_kv_heads * hd, h)
        elif name.endswith("o_proj.weight"):
            weights[name] = matrix(h, config.num_heads * hd)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            weights[name] = matrix(config.intermediate_size, h)
        elif name.endswith("down_proj.weight"):
            weights[name] = matrix(h, config.intermediate_size)
    weights["lm_head.weight"] = matrix(config.vocab_size, h, gain=4.0)
    return cast_weights(weights, config.dtype)


def dummy_tokenizer() -> Tokenizer:
    """Byte-level tokenizer: token id == UTF-8 byte value, plus ChatML specials."""
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(NUM_BYTES)}
    # No cache: with no merges it saves nothing, and without regex splitting its "words" are whole
    # prompts, so the default cache held the last 10,000 prompts (~38 MB of RSS in the soak).
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[], cache_capacity=0))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return Tokenizer(
        backend,
        eos_token_ids=(IM_END_ID,),
        chat_template=CHAT_TEMPLATE,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (used by ByteLevel)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    n = 0
    for b in range(NUM_BYTES):
        if b not in printable:
            printable.append(b)
            chars.append(NUM_BYTES + n)
            n += 1
    return dict(zip(printable, map(chr, chars)))
