PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTANCE ?= instances/two-campus-100km.yaml

.PHONY: venv run test lint bench clean

$(BIN)/placer: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/placer

venv: $(BIN)/placer

run: venv
	$(BIN)/placer solve $(INSTANCE)

test: venv
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check placer tests benchmarks

bench: venv
	$(BIN)/python benchmarks/solve_bench.py

clean:
	rm -rf $(VENV) out .pytest_cache
