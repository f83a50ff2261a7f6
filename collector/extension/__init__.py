"""Extensions: what serves the collector's data to people and tools rather than moving it: Jaeger's
query API (`jaeger_query`), the /ui timeline web view (`web_ui`, `ui/`), and the collector's own
health as Prometheus families (`self_telemetry`).
"""
