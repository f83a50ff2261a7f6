"""The request timeline: every request of a window as a row (`rows`), drawn (`plot`, matplotlib: the
`timeline` extra) by `otel-llm timeline` (`cli`).
"""
