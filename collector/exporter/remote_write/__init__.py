"""The Prometheus remote-write 1.0 exporter: the store's exposed series as samples (`series`), their
protobuf messages (`proto`), and the queued, retried sender (`exporter`).
"""
