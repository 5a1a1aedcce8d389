"""The hf backend computes a batch's shared token prefix once (corp/runtime/backends/shared_prefix.py):
the rows it generates are those of the left-padded batch, and the prefix is fed once, not per row."""

from __future__ import annotations

import pytest
import torch
from conftest import make_char_tokenizer, make_tiny_llama, make_tiny_qwen2

from corp.runtime.backends.hf import HFBackend
from corp.runtime.backends.shared_prefix import MIN_PREFIX, prefix_cache, shared_length

PREFIX = "system: you are a calculator.\nuser: "  # 36 tokens of the character tokenizer
QUESTIONS = ["1+2=", "12+34=", "7=", "100-1=", "3*3="]


def _tiny_gemma3(tokenizer, sliding_window: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],  # Gemma 3's hybrid cache: both kinds
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Gemma3ForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _backend(kind: str):
    tok = make_char_tokenizer()
    model = {
        "llama": lambda: make_tiny_llama(tok),
        "qwen2": lambda: make_tiny_qwen2(tok),
        "gemma3-wide": lambda: _tiny_gemma3(tok, sliding_window=128),
        "gemma3-narrow": lambda: _tiny_gemma3(tok, sliding_window=8),
    }[kind]()
    return HFBackend(_lively(model), tok, batch_size=8)


def _lively(model):
    """Every matrix redrawn at std 1/sqrt(fan-in): the default init's std 0.02 leaves a tiny model
    repeating one token whatever its context, which would hide a wrong layout."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return model


def _fed(backend, seqs, **kwargs):
    """(rows, the token count of every forward call) of one generate_rows."""
    calls: list[int] = []

    def count(module, args, kw):
        ids = kw.get("input_ids", args[0] if args else None)
        calls.append(ids.shape[0] * ids.shape[1])

    handle = backend.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        return backend.generate_rows(seqs, **kwargs), calls
    finally:
        handle.remove()


def _seqs(backend, prefix=PREFIX, questions=QUESTIONS):
    return [backend.tokenizer(prefix + q, add_special_tokens=False)["input_ids"] for q in questions]


SAMPLED = dict(temperature=1.0, top_p=0.9, row_seeds=[11, 12, 13, 14, 15])


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3-wide"])
@pytest.mark.parametrize("how", [{}, SAMPLED, {"stop": ["\n", "=="]}])
def test_the_prefix_is_fed_once_and_the_rows_are_the_left_padded_ones(kind, how):
    backend = _backend(kind)
    seqs = _seqs(backend)
    plain, plain_calls = _fed(backend, seqs, max_new_tokens=12, shared_prefix=False, **how)
    shared, shared_calls = _fed(backend, seqs, max_new_tokens=12, **how)
    assert shared == plain  # token ids and text of every row
    assert any(ids for ids, _ in plain)
    p = shared_length(seqs, how.get("stop"))
    assert p == len(PREFIX)  # the questions differ from their first character
    # one batch-1 forward of the prefix, then every row is fed only its own tokens
    assert shared_calls[0] == p and shared_calls[1] == len(seqs) * (max(map(len, seqs)) - p)
    assert sum(plain_calls) - sum(shared_calls) == (len(seqs) - 1) * p


@pytest.mark.parametrize(
    "kind,prefix",
    [
        ("llama", "ab"),  # a shared prefix shorter than MIN_PREFIX: not worth a forward
        ("llama", ""),  # nothing shared
        ("gemma3-narrow", PREFIX),  # a sliding window the rows do not fit in: the cache drops tokens
    ],
)
def test_without_a_usable_prefix_the_batch_is_left_padded(kind, prefix):
    backend = _backend(kind)
    seqs = _seqs(backend, prefix, ["x1+2=", "y12+34=", "z7="])
    plain, plain_calls = _fed(backend, seqs, max_new_tokens=8, shared_prefix=False)
    rows, calls = _fed(backend, seqs, max_new_tokens=8)
    assert rows == plain and calls == plain_calls


def test_shared_length_keeps_the_last_prompt_token_and_room_for_stop_strings():
    row = list(range(20))
    assert shared_length([row, row]) == 19  # identical rows: the last token is fed with the rest
    assert shared_length([row, row[:12]]) == 11
    assert shared_length([row, row[:12]], stop=["abc", "\n"]) == 9  # a 3-byte stop string: 3 tokens kept
    assert shared_length([row, row[:MIN_PREFIX]]) == 0  # under MIN_PREFIX left
    assert shared_length([row]) == 0  # one row: nothing to share
    assert shared_length([row, row[:10] + [99] + row[11:]]) == 10


def test_caches_that_are_not_plain_are_not_repeated():
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok)
    prefix = list(range(3, 3 + MIN_PREFIX))
    cache = prefix_cache(model, prefix, rows=3, total=40)
    assert cache is not None and cache.get_seq_length() == MIN_PREFIX
    assert all(layer.keys.shape[0] == 3 for layer in cache.layers)
    model.generation_config.cache_implementation = "static"  # generate would build its own
    assert prefix_cache(model, prefix, rows=3, total=40) is None
    model.generation_config.cache_implementation = None
    model.config.is_encoder_decoder = True
    assert prefix_cache(model, prefix, rows=3, total=40) is None
    model.config.is_encoder_decoder = False

    class OwnCache(torch.nn.Module):  # a model whose forward keeps its state elsewhere (Mamba-like)
        config, generation_config = model.config, model.generation_config

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, **kwargs):
            return None

    assert prefix_cache(OwnCache(), prefix, rows=3, total=40) is None
    gemma = _tiny_gemma3(tok, sliding_window=16)
    assert prefix_cache(gemma, prefix, rows=3, total=16) is None  # must fit strictly inside the window
    assert prefix_cache(gemma, prefix, rows=3, total=15) is not None
