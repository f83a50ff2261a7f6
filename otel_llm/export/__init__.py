"""Export: Prometheus text and OpenMetrics (`exposition`; prometheus_client-style families in
`prom_families`), the ASGI /metrics app (`asgi`), the aggregates as OTel metric data for standard
MetricReaders (`metric_producer`), OTLP metrics and traces set up from the OTEL_* environment
(`otlp_metrics`, `otlp_traces`, spans encoded by `span_encoding`, outcomes counted by
`export_counts`), and URLs as they may be shown (`redaction`).
"""
