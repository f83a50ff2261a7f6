"""SLOs as code: the SLO file (`config`), Prometheus rules and burn-rate alerts from the shim tables
(`rules`), their promtool unit tests (`rule_tests`), and `otel-llm slo` (`cli`)."""
