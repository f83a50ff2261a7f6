"""The OpenAI-compatible HTTP frontend (API process side of `otel-llm serve`)."""

from otel_llm.server.api.app import create_app

__all__ = ["create_app"]
