"""The Prometheus exporter: the metric store (OTLP points in, Prometheus series out, under the shim's
names), its text/OpenMetrics exposition, and the scrape endpoint serving it.
"""
