# The README's commands. `make test` and `make quickstart` each set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EGBERT_DATA ?= $(abspath ../shared/data)
export EGBERT_DATA
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test lint quickstart rlhf-demo bench gpu-check mutation clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch goes in first, on its own, so that egbert's install keeps the build chosen here.
# TORCH_SPEC pins the version; the index decides the build. From the default PyPI index on Linux
# torch==2.13.0 is the CUDA build (several GB with its CUDA libraries); for the CPU-only build:
#   make setup TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The pin also keeps `make test` as CI runs it on this project's machines: their pip configuration
# holds a local CPU wheel of torch 2.13.0, where a looser spec would pick a newer (CUDA) wheel.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet$(if $(TORCH_INDEX_URL), --index-url $(TORCH_INDEX_URL)) '$(TORCH_SPEC)'
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(BIN)/ruff check egbert tests scripts
	$(BIN)/ruff format --check egbert tests scripts

# Two pytest-xdist workers (each test process uses one thread: tests/conftest.py), each taking
# whole test files, so that a module's fixtures are built once.
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

# Mutation testing of the core (docs/testing.md), not part of `make test`: MODULES names the
# modules whose mutants run (their mutant names' globs); pyproject.toml's [tool.mutmut] the
# modules mutated and the tests. Results stay in mutants/ (a rerun goes on where it stopped).
MODULES ?= egbert.finetune.metrics
MUTATION_CHILDREN ?= 1
mutation: setup
	nice -n 10 $(BIN)/mutmut run --max-children $(MUTATION_CHILDREN) $(foreach m,$(MODULES),'$(m).*')
	$(BIN)/mutmut results --all true | awk -F': ' '{ name = $$1; sub(/^ +/, "", name); \
		sub(/\.x(_|ǁ).*/, "", name); count[name ": " $$2]++ } \
		END { for (key in count) print key, count[key] }' | sort

quickstart: setup
	$(BIN)/egbert quickstart

# RLHF on the CPU from the shared data (docs/experiments/rlhf-sst2.md): about an hour.
rlhf-demo: setup
	EGBERT=$(BIN)/egbert scripts/rlhf_demo.sh

bench: setup
	$(BIN)/python scripts/bench.py --model all

# On a machine with one NVIDIA GPU (docs/gpu.md): the suite, quickstart, kill and resume.
gpu-check: setup
	PYTHON=$(BIN)/python scripts/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache mutants
