"""Test helpers: the plain (non-paged, no KV cache) Llama forward of the model tests, the
ground truth the paged engine must match, and a loop that runs an engine to completion."""

from __future__ import annotations

from tests.server.model.reference_forward import forward as reference_logits  # noqa: F401 (re-exported)
from tests.server.model.reference_forward import greedy


def reference_greedy(config, weights, ids: list[int], max_new_tokens: int, stop_ids=()) -> list[int]:
    """Greedy continuation that runs to `max_new_tokens` unless a `stop_ids` token comes."""
    return greedy(config, weights, ids, max_new_tokens, stop_ids)


def run_to_completion(engine):
    """Step until idle. Returns ({(rid, seq): token ids}, {(rid, seq): text}, {(rid, seq): reason}, [telemetry])."""
    tokens: dict = {}
    texts: dict = {}
    reasons: dict = {}
    telemetry = []
    while engine.has_unfinished():
        step = engine.step()
        telemetry.append(step.telemetry)
        for out in step.outputs:
            key = (out.rid, out.seq_index)
            tokens.setdefault(key, []).extend(out.new_token_ids)
            texts[key] = texts.get(key, "") + out.text_delta
            if out.finished:
                assert key not in reasons, f"{key} finished twice"
                reasons[key] = out.finish_reason
    return tokens, texts, reasons, telemetry
