# rocketq: `make run` starts a broker, `make test` runs the suite. Both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test check lint typecheck bench replay demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/rocketq broker start --config conf/broker.toml --store-dir ./store

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python -m bench

replay: $(STAMP)
	$(BIN)/python -m bench.replay

demo: $(STAMP)
	$(BIN)/python -m demo

clean:
	rm -rf $(VENV) store bench/results .pytest_cache .mypy_cache
