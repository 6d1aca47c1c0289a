# Every target sets itself up: `make test` and `make run` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test lint format typecheck unit bench run flower chaos clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check shared coordinator workers tests bench
	$(VENV)/bin/ruff format --check shared coordinator workers tests bench

format: $(STAMP)
	$(VENV)/bin/ruff format shared coordinator workers tests bench
	$(VENV)/bin/ruff check --fix shared coordinator workers tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(PY) bench/tracker_cost.py
	$(PY) bench/stagnation_eval.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache build *.egg-info
