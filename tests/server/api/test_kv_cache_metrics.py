"""`--kv-cache-metrics` through the real server: the engine samples its KV blocks, /metrics shows
vLLM's residency histograms with the eviction counts."""

from __future__ import annotations

import openai
import pytest
from api_server_harness import ServerProcess, sample, wait_until

FAMILIES = ("vllm:kv_block_lifetime_seconds", "vllm:kv_block_idle_before_evict_seconds")


@pytest.mark.slow
def test_a_small_kv_cache_under_distinct_prompts_reports_evictions():
    # 128 blocks of 16 tokens; 12 distinct prompts of ~300 tokens need ~240 blocks: blocks are handed out again
    server = ServerProcess("--kv-cache-metrics", "--kv-cache-metrics-sample", "1", "--num-kv-blocks", "128",
                           "--max-num-seqs", "4").start()
    try:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            for i in range(12):
                client.completions.create(model="dummy", prompt=f"request {i} " + "word " * 300, max_tokens=4)
        assert wait_until(lambda: sample(server.metrics(), FAMILIES[0] + "_count") > 0)
        m = server.metrics()
        assert sample(m, FAMILIES[0] + "_count") == sample(m, FAMILIES[1] + "_count") >= 100
        assert sample(m, FAMILIES[0] + "_count", model_name="dummy", engine="0") == sample(m, FAMILIES[0] + "_count")
        assert sample(m, FAMILIES[0] + "_bucket", le="+Inf") == sample(m, FAMILIES[0] + "_count")
        assert "vllm:kv_block_reuse_gap_seconds_count" in m
        assert sample(m, "otel_llm_telemetry_dropped_total") == 0
    finally:
        server.stop()
