"""What an unauthenticated client and the log see: no credentials from the OTLP endpoints,
no process ids, no OpenAPI schema (docs are off)."""

from __future__ import annotations

import httpx
from api_server_harness import ServerProcess, free_port

from otel_llm.export.redaction import redact_url


def test_redact_url():
    assert redact_url("https://user:t0k@host:4318/v1/traces") == "https://xxxxx@host:4318/v1/traces"
    assert redact_url("http://t0k@host") == "http://xxxxx@host"
    assert redact_url("http://host/write?api_key=t0k&tenant=a") == "http://host/write?api_key=xxxxx&tenant=xxxxx"
    assert redact_url("http://host:4318") == "http://host:4318"
    assert redact_url(None) is None


def test_health_and_log_show_no_secrets_or_pids():
    port = free_port()  # nothing listens: exports fail, which must not log the URL either
    server = ServerProcess(env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://otel:s3cret-t0ken@127.0.0.1:{port}",
                                "OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    try:
        r = httpx.post(f"{server.url}/v1/completions", json={"model": "dummy", "prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200
        health = server.health().json()
        assert health["otlp_traces_endpoint"] == f"http://xxxxx@127.0.0.1:{port}"
        assert health["otlp_metrics_endpoint"] == f"http://xxxxx@127.0.0.1:{port}"
        assert not any("pid" in key for key in health), health
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert httpx.get(f"{server.url}{path}").status_code == 404, path
    finally:
        server.terminate()
        log = server.output()
        server.stop()
    assert f"127.0.0.1:{port}" in log  # the endpoint is logged, redacted
    assert "s3cret" not in log and "otel:" not in log, log
