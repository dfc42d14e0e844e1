# edgekv's two commands: `make chat` and `make test` (+ `make bench`).
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

.PHONY: test test-aarch64 chat bench install

test: $(STAMP)
	@for name in $(MODELS); do $(PULL) $$name || exit 1; done
	$(PY) -m edgekv warmup
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

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
