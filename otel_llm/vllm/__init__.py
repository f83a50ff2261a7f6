"""otel-llm inside vLLM: the stat-logger plugin `vllm serve` loads by entry point (`plugin`), folding
vLLM's per-step stats objects into the canonical aggregation (`stats`). Imports vLLM; nothing else
in otel_llm does.
"""
