"""Receivers: OTLP/HTTP (`otlp_http`), OTLP/gRPC (`otlp_grpc`) and the Prometheus scrape receiver
(`scrape`: the GETs in `scrape_fetch`, the exposition -> OTLP conversion in `scrape_convert`, which plans
each exposition's shape once in `scrape_plan` and knows a body of the last shape by `scrape_skeleton`).
"""
