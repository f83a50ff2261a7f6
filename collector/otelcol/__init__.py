"""The OpenTelemetry Collector Contrib config that does, beyond one host, what `otel-llm collector`
does, generated from the same profile tables (`config`; its traces part in `traces`).
"""
