"""The collector's data between components: OTLP payload codecs (`otlp_codec`), wire-compatible views
built for fast ingestion (`metrics_wire`, `traces_wire`, over `proto_classes`), and what an LLM
request span says (`request_span`).
"""
