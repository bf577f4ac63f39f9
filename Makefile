# FedSweep: the two commands a newcomer types are `make quickstart` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export MLFLOW_DISABLE_TELEMETRY ?= true
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: quickstart test install install-dev data lint format slow clean

## quickstart: create .venv, install fedsweep, get Fashion-MNIST, run the main job (a sweep)
quickstart: install data
	$(VENV)/bin/fedsweep sweep sweeps/quickstart.yaml --set name=quickstart-$$(date +%Y%m%d-%H%M%S)

## test: install the dev extra and run lint, the import contract and the default test suite
## (three pytest-xdist workers, handed one test at a time in collection order, the longest integration
## tests first; see tests/conftest.py)
test: install-dev data
	$(VENV)/bin/ruff check flcore sweeps search_spaces analysis benchmarks tests
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n 3 --dist load --maxschedchunk 1 --durations=25

## slow: the tests marked slow (long runs), left out of `make test`
slow: install-dev data
	$(PY) -m pytest -q -m slow

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

## data: make sure real Fashion-MNIST is on this machine (Debian's dataset-fashion-mnist)
data:
	@bash scripts/ensure-fmnist

lint: install-dev
	$(VENV)/bin/ruff check flcore sweeps search_spaces analysis benchmarks tests
	$(VENV)/bin/ruff format --check flcore sweeps search_spaces analysis benchmarks tests
	$(VENV)/bin/lint-imports

format: install-dev
	$(VENV)/bin/ruff format flcore sweeps search_spaces analysis benchmarks tests
	$(VENV)/bin/ruff check --fix flcore sweeps search_spaces analysis benchmarks tests

clean:
	rm -rf runs mlflow.db mlflow.db.lock .pytest_cache
