"""`Admission`: vLLM's frontend admission limits, `--max-num-queued-reqs` and `--max-num-queued-tokens`.

As vLLM 0.32's `AsyncLLM.check_admission` (vllm/v1/engine/async_llm.py), on what this API process
knows (`EngineClient`), not on the engine's scheduler queue:

- `--max-num-queued-reqs N`: refused when the unfinished sequences (waiting or running, a request
  with `n` counting `n`) plus the new request's `n` would exceed N.
- `--max-num-queued-tokens N`: refused while the prompt tokens of the requests that have had no
  output yet (each counted whole, times `n`, until its first token) are N or more; the new request's
  own prompt is not added.

A refused request gets 429 Too Many Requests by default (`{"error": {"message", "type":
"RateLimitError", "param": null, "code": 429}}`, what the issue asked and what the `openai` client
raises as `RateLimitError`), or with `--admission-status 503` exactly vLLM's 503 (`"type": "Service
Unavailable"`); vLLM's messages, no `Retry-After` (vLLM sends none); and it is counted in `vllm:admission_rejections_total{reason}`
(`Telemetry.reject`); it was never registered, so nothing else counts it. Event-loop thread only.
"""

from __future__ import annotations

import logging

from otel_llm.server.api.errors import OpenAIError

logger = logging.getLogger(__name__)

QUEUE_FULL = ("The engine is currently busy and cannot accept new requests. "
              "Please try again later or on a different instance.")
BACKLOG_FULL = ("The engine has reached its prefill token backlog limit. "
                "Please try again later or on a different instance.")


class Admission:
    """Checks the limits (None: no limit) against `client`'s counts; counts refusals in `telemetry`."""

    def __init__(self, client, telemetry, max_num_queued_reqs: int | None, max_num_queued_tokens: int | None,
                 status: int = 429):
        self.client = client
        self.status = status
        self.tel = telemetry
        self.max_num_queued_reqs = max_num_queued_reqs
        self.max_num_queued_tokens = max_num_queued_tokens

    def check(self, n: int, request_id: str | None) -> None:
        """Raise the refusal (`OpenAIError`) if a request of `n` sequences may not be admitted now."""
        limit = self.max_num_queued_reqs
        if limit is not None:
            current = self.client.num_queued_seqs
            if current + n > limit:
                logger.debug("Request queue full - rejecting request %s (current=%d, n=%d, max=%d).",
                             request_id, current, n, limit)
                self._refuse("max_num_queued_reqs", QUEUE_FULL)
        limit = self.max_num_queued_tokens
        if limit is not None:
            current = self.client.num_queued_prompt_tokens
            if current >= limit:
                logger.debug("Max queued tokens reached - rejecting request %s (current_tokens=%d, max=%d).",
                             request_id, current, limit)
                self._refuse("max_num_queued_tokens", BACKLOG_FULL)

    def _refuse(self, reason: str, message: str) -> None:
        self.tel.reject(reason)
        raise OpenAIError(self.status, message, error_type="Service Unavailable" if self.status == 503 else None)
