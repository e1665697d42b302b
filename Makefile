# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo up test lint clean

$(BIN)/kgstream: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	@touch $@

demo: $(BIN)/kgstream  ## bring everything up on the embedded default, index the sample, answer
	$(BIN)/kgstream demo

up: $(BIN)/kgstream  ## run the service in the foreground (Ctrl-C stops it)
	$(BIN)/kgstream up

lint: $(BIN)/kgstream
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint  ## lint, type-check, then unit, integration and e2e tests
	$(BIN)/python -m pytest

clean:
	$(BIN)/kgstream infra down --purge || true
	rm -rf .kgstream
