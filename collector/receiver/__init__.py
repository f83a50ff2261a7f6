"""Receivers: OTLP/HTTP (`otlp_http`), OTLP/gRPC (`otlp_grpc`) and the Prometheus scrape receiver
(`scrape`, with the exposition -> OTLP conversion in `scrape_convert`).
"""
