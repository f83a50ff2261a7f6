"""Exporters: each owns a bounded queue and a retry loop (the shared helper in `queue`, its storage
in `queue_storage`) and sends to one destination: OTLP backends (`otlp`), Prometheus remote-write
(`remote_write/`), the scrape endpoint and its metric store (`prometheus/`), the trace store
(`trace_store`).
"""
