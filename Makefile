# The two fresh-machine commands (see README):  make serve   |   make test
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip
TORCH ?= 2.13.0

.PHONY: setup serve test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH)   # first: a pinned CPU wheel; an unpinned torch pulls CUDA
	$(PIP) install -q -e '.[serve,test]'
	touch $@

setup: $(VENV)/.installed
	$(PY) -c "from server.model import ensure_smollm2_gguf; print('model file:', ensure_smollm2_gguf())"

# Main job: start the server on SmolLM2, run the built-in demo load against it, leave it serving.
serve: setup
	$(PY) -m server demo --start-server --model smollm2

test: setup
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/telemetry_overhead.py

clean:
	rm -rf $(VENV)
