"""The trace store (`--trace-store DIR`): spans in SQLite (`store`, its tables and their upgrade in
`schema`), what it answers in and how it matches (`query`), and OTLP/JSON files loaded into one
(`otlp_file`).
"""
