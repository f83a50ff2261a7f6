"""The canonical instruments and their points: the one table of instruments (`instruments`: names,
kinds, units, buckets, dimensions), the vectorised aggregation state the fast path writes into
(`aggregation`, held per Telemetry by `metrics_state`), and the series limits (`cardinality`).
"""
