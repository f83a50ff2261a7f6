"""The collector's data between components: OTLP payload codecs (`otlp_codec`), wire-compatible views
built for fast ingestion (`metrics_wire`, `traces_wire`, over `proto_classes`), what an LLM
request span says (`request_span`), and OTLP's rules for span ids (`span_ids`).
"""
