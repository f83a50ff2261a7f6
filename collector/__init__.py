"""`otel_llm.collector` (the repository's `collector/` folder): OTLP in -> compatibility shim ->
Prometheus and trace backends, laid out in the OpenTelemetry Collector's words.

`receiver/` decodes into the in-memory model of `pdata/`; `processor/` transforms it (the shim's
metric routes, phase spans, tail sampling); `exporter/` sends it on, each with its own queue;
`extension/` serves it (Jaeger's query API, /ui, self-telemetry); `tracestore/` keeps traces;
`service` wires one single-host collector from a `CollectorConfig`, `trace_pipeline` is its
traces pipeline, `cli` is `otel-llm collector`, `otelcol/` the Contrib config for beyond one host.
Needs the `collector` extra (`pip install 'otel-llm[collector]'`).
"""
