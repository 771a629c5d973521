# The README's commands. `make test` and `make quickstart` each set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EGBERT_DATA ?= $(abspath ../shared/data)
export EGBERT_DATA
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test lint quickstart bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: a looser spec pulls a multi-GB CUDA build instead of the local CPU one.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(BIN)/ruff check egbert tests scripts
	$(BIN)/ruff format --check egbert tests scripts

test: lint
	$(BIN)/python -m pytest -q tests

quickstart: setup
	$(BIN)/egbert quickstart

bench: setup
	$(BIN)/python scripts/bench.py --model all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
