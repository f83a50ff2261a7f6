"""The reference serving stack: a torch engine process plus an OpenAI-compatible
FastAPI frontend, instrumented with `otel_llm`. Entry point: `otel-llm serve`."""

__version__ = "0.1.0"
