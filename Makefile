# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo up test test-quick lint tools clean

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

# Debian packages some tests need: chromium (dashboard screenshot test) and prometheus
# (promtool checks metrics and alert rules). Installed when run as root with apt-get; otherwise
# nothing is installed and those tests skip, each saying which package it misses.
tools:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$missing >/dev/null \
		|| echo "apt-get failed: tests needing$$missing will be skipped"; \
	else \
		echo "not root or no apt-get: not installing$$missing; tests needing them will be skipped"; \
	fi

# The suite in parallel: 3 workers on a 2-core machine (much of a test is waiting on processes
# and servers); the heavy tests run one at a time per group (tests/conftest.py, PROCESS_GROUPS).
TEST_WORKERS ?= 3
test: lint tools  ## lint, type-check, then unit, integration and e2e tests
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# The inner loop while working: unit and the fast integration tests, no lint (2 min 36 s on an
# idle 2-core machine, about 4 with a heavy test beside it).
test-quick: $(BIN)/kgstream
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow" tests/unit tests/integration tests/deploy

clean:
	$(BIN)/kgstream infra down --purge || true
	rm -rf .kgstream
