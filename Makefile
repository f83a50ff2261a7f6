# The two fresh-machine commands (see README):  make serve   |   make test
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip
TORCH ?= 2.13.0
# A connection cut off mid-download is resumed and retried instead of failing the set-up.
export PIP_RETRIES ?= 10
export PIP_RESUME_RETRIES ?= 10

.PHONY: setup serve test test-vllm-matrix bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH)   # first: a pinned CPU wheel; an unpinned torch pulls CUDA
	$(PIP) install -q -e '.[all,test]'
	touch $@

setup: $(VENV)/.installed
	$(PY) -c "from otel_llm.server.model import ensure_smollm2_gguf; print('model file:', ensure_smollm2_gguf())"

PORT   ?= 8000
MODEL  ?= smollm2
TRACES ?= .traces

# Main job: the whole shape on one host. A collector (OTLP in on 4318/4317; Prometheus /metrics with
# vLLM's names on 9464; traces kept, request timelines at http://127.0.0.1:16686/ui); the server on
# SmolLM2 pushing its metrics (every 5 s) and spans there; the built-in demo load against it; both
# left running until Ctrl-C, which stops the server first (its last metrics and spans still reach the
# collector: it runs in a session of its own), then the collector. `make serve PORT=8001`: another port.
serve: setup
	@setsid $(PY) -m otel_llm collector --trace-store $(TRACES) & cpid=$$!; \
	OTEL_METRIC_EXPORT_INTERVAL=5000 $(PY) -m otel_llm serve --model $(MODEL) --port $(PORT) \
	  --otlp-traces-endpoint http://127.0.0.1:4318 --otlp-metrics-endpoint http://127.0.0.1:4318 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid; kill $$cpid 2>/dev/null; wait $$cpid; exit 0' INT TERM; \
	trap 'kill $$pid $$cpid 2>/dev/null' EXIT; \
	$(PY) -c "import sys,time,httpx; d=time.time()+300; \
	exec('while time.time()<d:\n try:\n  if httpx.get(\'http://127.0.0.1:$(PORT)/health\').status_code==200: sys.exit(0)\n except httpx.HTTPError: pass\n time.sleep(0.5)'); sys.exit('server did not become healthy')" && \
	$(PY) -m otel_llm demo --url http://127.0.0.1:$(PORT) --timeline-url http://127.0.0.1:16686/ui && \
	echo "Server still running on http://127.0.0.1:$(PORT) (its /metrics; Triton stats: /v2/models/stats). The collector: http://127.0.0.1:9464/metrics (every server's metrics under vLLM's names, pushed every 5 s), request timelines at http://127.0.0.1:16686/ui. Ctrl-C to stop." && \
	wait $$pid

test: setup
	$(PY) -m pytest -q

# Only the plugin's release checks: every vLLM release's source, and every CPU build 0.27.1-0.32.0 run
# (`make test` runs the oldest and the newest; OTEL_LLM_VLLM_MATRIX=1 make test runs them all too).
test-vllm-matrix: setup
	OTEL_LLM_VLLM_MATRIX=1 $(PY) -m pytest -q tests/vllm/test_released_sources.py tests/vllm/test_vllm_releases.py

bench: $(VENV)/.installed
	$(PY) benchmarks/telemetry_overhead.py

clean:
	rm -rf $(VENV)
