# One place for the commands a developer and CI run. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export FLOWHOOK_TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test
# pytest-xdist workers: more than the cores, as most of a test's time is waiting on a server,
# a database or a subprocess.
WORKERS ?= 4
# A lane's pytest options (make test PYTEST_ARGS='-x tests/unit'); a file alone runs fastest
# as `.venv/bin/pytest tests/unit/test_retry.py` (no coverage, no workers).
PYTEST_ARGS ?=

.PHONY: help install install-dev serve test soak lint format typecheck check bench clean

help:
	@echo "make serve      set up and start Flowhook on SQLite (http://127.0.0.1:8080)"
	@echo "make test       the gate: set up, make sure PostgreSQL is up, run every test but the soak lane"
	@echo "                (WORKERS=4 xdist workers, coverage with its floor; ~15 min on 2 cores)"
	@echo "make soak       the soak lane: chaos, benchmark smoke, scale-out, flow-control scale,"
	@echo "                the PostgreSQL restart, the stateful OpenAPI fuzz (tests marked soak)"
	@echo "one file, fast: .venv/bin/pytest tests/unit/test_retry.py  (add -n 4 for a large one)"
	@echo "make check      ruff, format check and mypy"
	@echo "make bench      the benchmark suite on SQLite and PostgreSQL (see bench/README.md)"

# Two stamps: `make serve` installs what running needs (Flowhook and its dependencies); the
# tests, checks and benchmarks install the dev extra beside it (pytest, mypy, schemathesis,
# playwright, matplotlib: about five times the size).
RUNTIME := $(VENV)/.flowhook-runtime
DEV := $(VENV)/.flowhook-dev

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	@touch $@

$(DEV): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(RUNTIME) $@

install: $(RUNTIME)

install-dev: $(DEV)

serve: install
	$(BIN)/flowhook serve

test: install-dev
	scripts/ensure-postgres
	scripts/ensure-chromium
	scripts/ensure-wrk
	scripts/ensure-tmux
	scripts/ensure-jq
	scripts/ensure-node
	$(BIN)/pytest -n $(WORKERS) --dist worksteal --cov -m "not soak and not no_tracer" --durations=30 $(PYTEST_ARGS)
	$(BIN)/pytest -n $(WORKERS) --dist worksteal -m "not soak and no_tracer" $(PYTEST_ARGS)

soak: install-dev
	scripts/ensure-postgres
	scripts/ensure-wrk
	$(BIN)/pytest -n 2 --dist worksteal -m soak --timeout 900 --durations=15 $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: install-dev
	$(BIN)/mypy

check: lint typecheck

bench: install-dev
	scripts/ensure-postgres
	scripts/ensure-wrk
	$(BIN)/python bench/suite.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.* flowhook.db flowhook.db-*
