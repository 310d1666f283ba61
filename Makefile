# One place for the commands a developer and CI run. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export FLOWHOOK_TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: help install serve test lint format typecheck check bench clean

help:
	@echo "make serve      set up and start Flowhook on SQLite (http://127.0.0.1:8080)"
	@echo "make test       set up, make sure PostgreSQL is up, run every test"
	@echo "make check      ruff, format check and mypy"
	@echo "make bench      the benchmark suite on SQLite and PostgreSQL (see bench/README.md)"

$(BIN)/flowhook: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

install: $(BIN)/flowhook

serve: install
	$(BIN)/flowhook serve

test: install
	scripts/ensure-postgres
	scripts/ensure-chromium
	scripts/ensure-wrk
	scripts/ensure-tmux
	scripts/ensure-node
	$(BIN)/pytest --cov -m "not no_tracer"
	$(BIN)/pytest -m no_tracer

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: install
	$(BIN)/mypy

check: lint typecheck

bench: install
	scripts/ensure-postgres
	scripts/ensure-wrk
	$(BIN)/python bench/suite.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.* flowhook.db flowhook.db-*
