"""The otel-llm collector: OTLP in -> compatibility shim -> Prometheus and trace backends."""
