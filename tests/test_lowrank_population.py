"""The batched factored pass of a low-rank population equals scoring each specialist alone with
materialised weights, up to floating-point rounding (tolerance: logits within 1e-4 of their scale
in fp32; greedy answers agree on >= 99% of prompts)."""

from __future__ import annotations

import pytest
import torch

from corp.algorithms.perturb import Direction
from corp.config import RandOptConfig, load_config
from corp.evaluate.scorer import ensure_population
from corp.runtime.backends.batched_lowrank import FactoredPopulation, population_generations
from corp.runtime.backends.hf import HFBackend
from corp.runtime.context import score_one, setup_run
from tests.conftest import make_char_tokenizer

R2 = "corp-lowrank-v1:r=2"


def llama(tok, tied: bool, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def backend(tied: bool, batch_size: int = 64, scheme: str = R2):
    tok = make_char_tokenizer()
    return HFBackend(llama(tok, tied), tok, batch_size=batch_size, scheme=scheme)


SPECS = [(101, 0.3), (102, 0.3), (103, 0.6)]


@pytest.mark.parametrize("tied", [False, True])
def test_factored_logits_match_materialised_weights(tied):
    b = backend(tied)
    if tied:
        assert b.model.lm_head.weight is b.model.model.embed_tokens.weight
    ids = torch.tensor([b.encode(["12+34=", "7*8=?", "abcdef"])[k][:5] for k in range(3)])  # 3 prompts x 5 tokens
    fp = FactoredPopulation(b.model, b.perturber.params, R2)
    assert len(fp.embeddings) == 1 and len(fp.linears) == 2 * 7 + 1  # the lm_head is hooked, tied or not
    with torch.inference_mode():
        base = b.model(input_ids=ids).logits
        with fp.hooks():
            fp.set_group([fp.draw(s) for s, _ in SPECS], [sg for _, sg in SPECS])
            got = b.model(input_ids=ids.repeat(len(SPECS), 1)).logits.view(len(SPECS), *base.shape)
        for i, (s, sg) in enumerate(SPECS):
            b.set_direction(Direction.single(s, sg))
            want = b.model(input_ids=ids).logits
            scale = want.abs().max().item()
            assert (got[i] - want).abs().max().item() <= 1e-4 * scale, f"specialist {i}"
            assert (want - base).abs().max().item() > 100 * 1e-4 * scale, (
                "the perturbation must move the logits far beyond the tolerance"
            )
        b.set_direction(None)


@pytest.mark.parametrize("tied", [False, True])
def test_embedding_perturbation_is_part_of_the_factored_pass(tied, monkeypatch):
    """Guards the embedding lookup term: only the embedding perturbed, logits must still match."""
    from corp.algorithms.perturb import ParamFilter

    tok = make_char_tokenizer()
    b = HFBackend(llama(tok, tied), tok, batch_size=8, param_filter=ParamFilter(include="embed_tokens"), scheme=R2)
    ids = torch.tensor([b.encode(["12+34="])[0][:6]])
    fp = FactoredPopulation(b.model, b.perturber.params, R2)
    with torch.inference_mode():
        base = b.model(input_ids=ids).logits
        with fp.hooks():
            fp.set_group([fp.draw(SPECS[0][0])], [1.0])
            got = b.model(input_ids=ids).logits
        b.set_direction(Direction.single(SPECS[0][0], 1.0))
        want = b.model(input_ids=ids).logits
    b.set_direction(None)
    scale = want.abs().max().item()
    assert (want - base).abs().max().item() > 100 * 1e-4 * scale
    assert (got - want).abs().max().item() <= 1e-4 * scale


def test_greedy_answers_agree_on_at_least_99_percent_of_prompts():
    b = backend(
        tied=True, batch_size=16
    )  # 32 prompts: batches of 16 prompts of one specialist; at 64, 2 specialists x 32
    prompts = [f"{i}+{3 * i % 17}=" for i in range(32)]
    specs = [(101, 0.3), (102, 0.5), (103, 0.6), (104, 0.45)]  # distinct sigmas: a group mixing up its rows shows
    batched = {
        i: g
        for i, g, _ in population_generations(
            b, FactoredPopulation(b.model, b.perturber.params, R2), specs, prompts, 10
        )
    }
    b.batch_size = 64
    batched64 = {
        i: g
        for i, g, _ in population_generations(
            b, FactoredPopulation(b.model, b.perturber.params, R2), specs, prompts, 10
        )
    }
    base = b.generate(prompts, 10).texts
    agree = agree64 = moved = 0
    for i, (s, sg) in enumerate(specs):
        b.set_direction(Direction.single(s, sg))
        alone = b.generate(prompts, 10)
        agree += sum(x == y for x, y in zip(alone.texts, batched[i].texts))
        agree64 += sum(x == y for x, y in zip(alone.texts, batched64[i].texts))
        moved += sum(x != y for x, y in zip(alone.texts, base))
    b.set_direction(None)
    total = len(specs) * len(prompts)
    assert agree >= 0.99 * total and agree64 >= 0.99 * total, (agree, agree64, total)
    assert moved >= total // 2, "the specialists must answer differently from the base, or agreement says nothing"


def cfg(run_dir, **kw):
    base = dict(
        task="arith",
        population=5,
        sigmas="0.3,0.6",
        n_support=6,
        n_probe=0,
        n_validation=0,
        n_test=2,
        top_k="1",
        max_new_tokens=6,
        run_dir=str(run_dir),
        noise="lowrank:r=2",
        batch_size=12,
    )
    base.update(kw)
    return load_config(RandOptConfig, None, base)


def test_scorer_uses_the_factored_pass_and_its_rows_equal_one_at_a_time_rows(tmp_path):
    b = backend(tied=True, batch_size=12)
    applied = []
    real = b.set_direction
    b.set_direction = lambda d: (applied.append(d), real(d))[1]
    ctx = setup_run(cfg(tmp_path / "run"), "randopt", b)
    rows = ensure_population(ctx)
    assert all(d is None for d in applied), "the factored pass writes no weights"
    assert len(rows) == 5 and all(r["scoring"] == "factored" for r in rows)
    assert all(r["identity"] and r["key"] for r in rows)
    for r in rows:
        alone = score_one(ctx, r["seed"], r["sigma"], "support")  # materialised weights, one at a time
        assert alone["key"] == r["key"]
        for field in ("answers", "rewards", "correct", "prompt_tokens", "generated_tokens", "reward", "what"):
            assert alone[field] == r[field], (field, r["seed"])
    ctx.close()
    # a resume scores nothing again
    b2 = backend(tied=True, batch_size=12)
    b2.generate_rows = lambda *a, **k: pytest.fail("a finished population is not scored again")
    again = ensure_population(setup_run(cfg(tmp_path / "run"), "randopt", b2))
    assert [r["key"] for r in again] == [r["key"] for r in rows]


def _population_methods():
    from dataclasses import fields

    from corp.methods import METHODS

    return [m.name for m in METHODS if m.smoke is not None and "noise" in {f.name for f in fields(m.config)}]


@pytest.mark.parametrize("name", _population_methods())
def test_every_population_method_runs_unchanged_with_low_rank_noise(name, tiny_dir, tmp_path):
    """Every method with --noise runs on a low-rank population; its population and recipe name the
    scheme, and its recipe rebuilds the saved model bit-exactly."""
    import json

    from corp.algorithms.recipe import apply_recipe
    from corp.methods import REGISTRY
    from tests.test_methods import COMMON, STRONGER, _tensors

    m = REGISTRY[name]
    run_dir = tmp_path / name
    options = {
        **m.smoke,
        **COMMON,
        **STRONGER.get(name, {}),
        "model": str(tiny_dir),
        "run_dir": str(run_dir),
        "noise": "lowrank:r=2",
    }
    m(load_config(m.config, None, options))
    meta = run_dir / "population_meta.json"
    if meta.exists():
        assert json.loads(meta.read_text())["noise_scheme"] == R2
    if m.recipes:
        recipe = json.loads((run_dir / "recipe.json").read_text())
        assert recipe["noise_scheme"] == R2
        out = apply_recipe(run_dir / "recipe.json", tmp_path / "rebuilt")
        saved, rebuilt = _tensors(run_dir / "model"), _tensors(out)
        assert all(torch.equal(saved[k], rebuilt[k]) for k in saved)
