# The two commands a fresh machine needs: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/default
PORT ?= 50051
HTTP_PORT ?= 8080
METRICS_PORT ?= 9464
BUF_VERSION ?= 1.75.0
BUF := .tools/node_modules/.bin/buf

.PHONY: install serve serve-ray test test-fast lint containers browser proto export benchmarks clean

# One stamp per install: re-runs only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	@echo "install: $(VENV) with attnserve and its extras gpu, export, ray, dev from PyPI: ONNX" \
		"Runtime, torch 2.13.0 (CPU), Ray Serve, transformers, the test tools; about 3 minutes" \
		"and 3 GB the first time"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[gpu,export,ray,dev]'
	touch $@

install: $(VENV)/.installed

# buf (protobuf lint) ships as a binary inside an npm package.
$(BUF):
	npm install --silent --no-save --prefix .tools @bufbuild/buf@$(BUF_VERSION)

# The default model: the committed trained checkpoint, its SAE and its transcoders
# (re-exported when one changes).
DEFAULT_CHECKPOINT := model/pretrained/default.safetensors
DEFAULT_SAE := model/pretrained/default-sae/sae_weights.safetensors
DEFAULT_TRANSCODERS := $(wildcard model/pretrained/default-transcoders/*.safetensors)
$(MODEL_DIR)/model.onnx: $(DEFAULT_CHECKPOINT) $(DEFAULT_SAE) $(DEFAULT_TRANSCODERS) | $(VENV)/.installed
	$(VENV)/bin/attnserve export --out $(MODEL_DIR)

export: $(MODEL_DIR)/model.onnx

# Sets up, exports the default model if it is missing, and serves it over gRPC and HTTP
# (Ctrl-C drains and stops).
serve: $(VENV)/.installed $(MODEL_DIR)/model.onnx
	@echo "gRPC on localhost:$(PORT); attention explorer on http://localhost:$(HTTP_PORT)/ (API docs: /docs); metrics on $(METRICS_PORT)"
	$(VENV)/bin/attnserve serve --model $(MODEL_DIR) --port $(PORT) --http-port $(HTTP_PORT) \
		--metrics-port $(METRICS_PORT)

# The default model on Ray Serve (deploy/ray/serve.yaml): HTTP on 8000, gRPC on 9000.
serve-ray: $(VENV)/.installed $(MODEL_DIR)/model.onnx
	$(VENV)/bin/serve run deploy/ray/serve.yaml

# Regenerates the committed Python code of protos/attnserve/v1/*.proto.
proto: $(VENV)/.installed
	$(PY) protos/generate.py

lint: $(VENV)/.installed $(BUF)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	cd protos && ../$(BUF) lint

# A container engine for tests/deploy: podman where no Docker engine exists (skips without root).
containers:
	deploy/podman-setup.sh

# Chromium for the explorer page's browser tests (skips without root).
browser:
	deploy/browser-setup.sh

# Sets up and runs every test (after the linters, which CI enforces too).
test: lint containers browser
	$(PY) -m pytest

# The unit tests only (no containers, browser, peers, Ray clusters, benchmarks or exports):
# a few minutes.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not slow"

# Reruns every benchmark (~30 min) and regenerates docs/BENCHMARKS.md from the results.
benchmarks: $(VENV)/.installed
	$(PY) -m perf report --out bench-results --doc docs/BENCHMARKS.md

clean:
	rm -rf $(VENV) .tools models bench-results .pytest_cache .ruff_cache
