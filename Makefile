# edgekv's two commands: `make chat` and `make test` (+ `make test-fast`, `make bench`).
# Each sets up what it needs on first use (.venv, an editable install, the models, the
# kernels compiled for this CPU by `edgekv warmup`) and is cheap to repeat: pip runs again
# only when pyproject.toml changes, a model already in the cache (~/.cache/edgekv/models,
# or $EDGEKV_HOME/models) is not fetched or re-hashed, and warm kernels are not recompiled.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.edgekv-installed
MODELS      := smollm2-135m-instruct gemma3-270m
PYTEST_ARGS ?=
PULL        := $(PY) -m edgekv pull

.PHONY: test test-python test-cuda-cpu models test-fast lint test-aarch64 chat bench install

# make test is its two halves in turn: the Python suite (printing its 30 slowest tests), then
# native/'s kernels on the CPU. CI (.ci/run) overlaps them with make test-aarch64 (see .ci/run).
test: test-python test-cuda-cpu

test-python: $(STAMP) lint models
	$(PY) -m edgekv warmup
	$(PY) -m pytest -q -rs --durations=30 $(PYTEST_ARGS)

# native/*.cu run on this CPU as C++ under AddressSanitizer and UBSan (tests/cuda_cpu.py:
# pytest with ASan's runtime preloaded, the tests marked cuda_cpu; ~15 min of make test)
CUDA_CPU    := $(PY) tests/cuda_cpu.py -q -rs
test-cuda-cpu: $(STAMP) models
	$(CUDA_CPU) -m cuda_cpu $(PYTEST_ARGS)

models: $(STAMP)
	@for name in $(MODELS); do $(PULL) $$name || exit 1; done

# pyflakes and syntax errors over the whole tree (the rules: pyproject.toml [tool.ruff])
lint: $(STAMP)
	$(VENV)/bin/ruff check edgekv tests tools benchmarks

# the quick loop while developing (~7 min on 2 cores; make test ~50-70): unit tests and tiny
# random models. It leaves out what is marked `slow` (needs a real model, so none is pulled
# here: the real-model checks against llama.cpp, perplexity, KL, convert, quantize, grammar,
# chat, server), `long` (fuzz loops, server load, interrupts, the heaviest tiny-model sweeps;
# tests/conftest.py) and `gpu`. make test runs all but `gpu`, as before.
FAST        := not slow and not long and not gpu
test-fast: $(STAMP) lint
	$(PY) -m edgekv warmup
	$(PY) -m pytest -q -rs -m "$(FAST)" $(PYTEST_ARGS)
	$(CUDA_CPU) -m "cuda_cpu and $(FAST)" $(PYTEST_ARGS)

# the aarch64 code under QEMU user-mode emulation (tools/test_aarch64.sh; needs root)
test-aarch64: $(STAMP)
	$(PULL) smollm2-135m-instruct
	bash tools/test_aarch64.sh

chat: $(STAMP)
	$(PULL)
	$(PY) -m edgekv warmup
	$(VENV)/bin/edgekv chat

bench: $(STAMP)
	@found=0; for script in benchmarks/*.py; do \
	    case "$${script##*/}" in _*) continue;; esac; \
	    [ -e "$$script" ] || continue; found=1; \
	    echo "== $$script"; $(PY) "$$script" || exit 1; \
	done; [ $$found = 1 ] || echo "no benchmarks yet: add scripts as benchmarks/*.py"

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[dev]'
	touch $@
