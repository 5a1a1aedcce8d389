"""Seeded sampling: a sampled evaluation is fixed by the run's seed, what is evaluated and the
example, never by the batch it shares or the order a resumed run evaluates in (hf backend, tiny
random model; the vLLM counterpart is in test_vllm_backend.py)."""

from __future__ import annotations

import pytest

from corp.config import load_config
from corp.methods.self_consistency import SelfConsistencyConfig, run_self_consistency
from corp.runtime.backends.hf import HFBackend, RowSampler
from corp.runtime.context import eval_identity, eval_key
from tests.conftest import make_char_tokenizer, make_tiny_llama

PROMPTS = ["abc", "hello world", "x", "12+30="]


def test_rows_are_fixed_by_their_seeds_not_their_batch(tiny_backend):
    seeds = [11, 22, 33, 44]
    one = tiny_backend.generate(PROMPTS, 12, temperature=1.0, n=2, seeds=seeds)
    assert tiny_backend.generate(PROMPTS, 12, temperature=1.0, n=2, seeds=seeds).texts == one.texts
    # other batching (batch size 1, reversed prompt order): every prompt's two samples unchanged
    tiny_backend.batch_size = 1
    rev = tiny_backend.generate(PROMPTS[::-1], 12, temperature=1.0, n=2, seeds=seeds[::-1]).texts
    assert [t for i in range(len(PROMPTS) - 1, -1, -1) for t in rev[2 * i : 2 * i + 2]] == one.texts
    # a prompt alone, with its seed, draws what it drew among the others
    assert tiny_backend.generate(PROMPTS[1:2], 12, temperature=1.0, n=2, seeds=seeds[1:2]).texts == one.texts[2:4]
    other = tiny_backend.generate(PROMPTS, 12, temperature=1.0, n=2, seeds=[s + 1 for s in seeds]).texts
    assert sum(a != b for a, b in zip(one.texts, other)) >= 6, "other seeds draw other samples"
    assert len(set(one.texts[0:2])) == 2, "a prompt's n samples are distinct draws"


def test_row_sampler_draws_from_the_tempered_distribution():
    import torch

    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]] * 20000)
    picked = RowSampler(list(range(20000)), 1.0, 1.0)(None, logits).argmax(1)
    freq = torch.bincount(picked, minlength=4) / 20000
    assert torch.allclose(freq, logits[0].softmax(0), atol=0.015)
    # top-p 0.8 at T=0.5: token 2 alone holds 0.865 of the mass
    assert set(RowSampler(list(range(500)), 0.5, 0.8)(None, logits[:500]).argmax(1).tolist()) == {2}


def test_the_seed_is_in_a_sampled_rows_key_not_a_greedy_ones():
    ctx = {"model": "m", "weights_hash": "h"}
    sampled = [eval_key(eval_identity(ctx, "base", ["a"], n=2, temperature=1.0, seed=s)) for s in (0, 1)]
    assert sampled[0] != sampled[1]
    assert eval_key(eval_identity(ctx, "base", ["a"])) == eval_key(eval_identity(ctx, "base", ["a"], seed=5))
    with pytest.raises(ValueError):
        eval_identity(ctx, "base", ["a"], n=2, temperature=1.0)


class Recording(HFBackend):
    """The hf backend, recording every sampled completion; `fail_sampled` interrupts the first sampled call."""

    fail_sampled = False

    def generate(self, prompts, max_new_tokens, temperature=0.0, **kw):
        if temperature > 0 and self.fail_sampled:
            self.fail_sampled = False
            raise KeyboardInterrupt
        out = super().generate(prompts, max_new_tokens, temperature=temperature, **kw)
        if temperature > 0:
            self.sampled.append(out.texts)
        return out


def _backend():
    tok = make_char_tokenizer()
    b = Recording(make_tiny_llama(tok), tok, batch_size=8)
    b.sampled = []
    return b


def _sc(run_dir, seed, backend):
    cfg = load_config(
        SelfConsistencyConfig,
        None,
        {
            "model": "tiny",
            "task": "arith",
            "n_support": 0,
            "n_probe": 0,
            "n_validation": 0,
            "n_test": 4,
            "k": "1,3",
            "max_new_tokens": 6,
            "temperature": 1.0,
            "seed": seed,
            "run_dir": str(run_dir),
        },
    )
    run_self_consistency(cfg, backend)
    return backend.sampled[-1]


def test_self_consistency_samples_follow_the_seed_and_survive_a_resume(tmp_path):
    b = _backend()
    s0 = _sc(tmp_path / "a", 0, b)
    assert _sc(tmp_path / "b", 0, b) == s0, "the same --seed draws the same samples"
    assert _sc(tmp_path / "c", 1, b) != s0, "another --seed draws other samples"
    # interrupted before its sampled evaluation, then resumed in the same run directory
    b.fail_sampled = True
    with pytest.raises(KeyboardInterrupt):
        _sc(tmp_path / "d", 0, b)
    assert _sc(tmp_path / "d", 0, b) == s0
    # a fresh backend (other process state, other batch size) draws the same
    fresh = _backend()
    fresh.batch_size = 3
    assert _sc(tmp_path / "e", 0, fresh) == s0
