# The two commands of README.md: `make generate` and `make test`. Both set up .venv on first use
# (torch's CPU wheel, triton from PyPI, this package in editable mode with its test extra).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: generate check test bench

$(BIN)/kvlayout: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

generate: $(BIN)/kvlayout
	$(BIN)/kvlayout generate

check: $(BIN)/kvlayout
	$(BIN)/kvlayout check

test: $(BIN)/kvlayout
	$(BIN)/python -m tests.run

# GPU only (a CUDA device): every spec x op, the device copy in the same run (see README, Performance).
bench: $(BIN)/kvlayout
	$(BIN)/kvlayout bench
