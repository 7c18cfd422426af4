# The two commands a fresh machine needs: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/default
PORT ?= 50051

.PHONY: install serve test lint export bench clean

# One stamp per install: re-runs only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[export,dev]'
	touch $@

install: $(VENV)/.installed

$(MODEL_DIR)/model.onnx: | $(VENV)/.installed
	$(PY) -m export --out $(MODEL_DIR) --seed 0

export: $(MODEL_DIR)/model.onnx

# Sets up, exports the default model if it is missing, and runs it.
serve: $(VENV)/.installed $(MODEL_DIR)/model.onnx
	$(PY) -m service --model $(MODEL_DIR)

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Sets up and runs every test (and the linter, which CI enforces too).
test: lint
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) -m bench latency --out bench-results

clean:
	rm -rf $(VENV) models bench-results .pytest_cache .ruff_cache
