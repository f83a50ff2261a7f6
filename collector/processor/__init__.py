"""Processors: the shim's metric routes (`metric_routes`), derived phase spans for engines that only
report latencies (`phase_spans`), LLM-aware tail sampling (`tail_sampling`).
"""
