"""The frontend (API process): `Telemetry` (`telemetry`, configured by `config`'s `TelemetryConfig`)
applies each step to the columnar request table (`request_table`, one row per `RequestInfo` of
`request`), builds each request's gen_ai span tree at its finish (`request_spans`, bounded by
`span_limits`), keeps LoRA state (`lora`), Triton's cumulative statistics (`triton_stats`) and the
periodic stat line (`stat_logger`).
"""
