"""CoRP's step search on a low-rank population, evaluated in the factored pass: every candidate
base + t * m (m a merged term of K elites, rank <= K r per matrix) is the same factor pair scaled
by t, added by forward hooks with nothing materialised. It must equal the dense path (W0 + t M
materialised) up to floating-point rounding: logits within 1e-4 of their scale, greedy answers on
>= 99% of prompts (all of them here), and a whole `corp consolidate` must choose the same step and
see the same rewards. Full-rank runs keep the dense path."""

from __future__ import annotations

import json

import pytest
import torch

from corp.algorithms.perturb import Component, Direction
from corp.runtime.backends.batched_lowrank import FactoredPopulation, direction_generations
from tests.conftest import tiny_consolidate_config
from tests.test_lowrank_population import R2, backend

ALPHAS = [0.5, 1.0, 2.0, 4.0]
# seed 101 twice: its coefficients must be summed into one factor block
M = Direction.merged(
    [Component(101, 0.3, 0.5), Component(102, 0.3, -0.25), Component(103, 0.6, 0.4), Component(101, 0.3, 0.1)]
)


def text_checksum(completions, **_):
    """A reward that moves whenever the output text moves (the tiny model's answers are never right)."""
    return [(sum(map(ord, c)) % 97) / 96 for c in completions]


@pytest.mark.parametrize("tied", [False, True])
def test_factored_candidates_match_materialised_weights_at_every_step_size(tied):
    b = backend(tied)
    ids = torch.tensor([b.encode(["12+34=", "7*8=?", "abcdef"])[k][:5] for k in range(3)])
    fp = FactoredPopulation(b.model, b.perturber.params, R2)
    found = [fp.direction_factors(M.scaled(a)) for a in ALPHAS]
    assert all(unit is found[0][0] for unit, _ in found), "every step size shares one factor pair, drawn once"
    assert [s for _, s in found] == ALPHAS
    K = 3  # distinct seeds
    assert all(A.shape[1] == K * 2 and B.shape[1] == K * 2 for A, B in found[0][0].values())
    # another rule's direction over the same elites (m1 beside m2): A is shared, only B's blocks rescale
    m1 = Direction.merged([Component(101, 0.3, 0.2), Component(102, 0.3, 0.7), Component(103, 0.6, 0.1)])
    unit1, _ = fp.direction_factors(m1)
    assert all(unit1[n][0] is found[0][0][n][0] for n in unit1), "the same elites' factors are drawn once"
    other = Direction.merged([Component(7, 0.5)]) + M.scaled(2.0)  # two terms (stage 2's centre + t m)
    plain = Direction([Component(104, 0.4, 1.5), Component(105, 0.2, -1.0)])
    cases = [(M.scaled(a), found[0][0], a) for a in ALPHAS]
    cases += [(d, *fp.direction_factors(d)) for d in (m1.scaled(3.0), other, plain)]
    with torch.inference_mode():
        base = b.model(input_ids=ids).logits
        got = []
        with fp.hooks():
            fp.set_shared(found[0][0], ALPHAS)  # the four step sizes as row groups of one pass
            grouped = b.model(input_ids=ids.repeat(len(ALPHAS), 1)).logits.view(len(ALPHAS), *base.shape)
            got += list(grouped)
            for _, unit, scale in cases[len(ALPHAS) :]:
                fp.set_shared(unit, [scale])
                got.append(b.model(input_ids=ids).logits)
            fp.set_shared(found[0][0], [1.1 * ALPHAS[-1]])  # planted: a wrong step size
            wrong = b.model(input_ids=ids).logits
        for (d, _, _), g in zip(cases, got):
            b.set_direction(d)
            want = b.model(input_ids=ids).logits
            tol = 1e-4 * want.abs().max().item()
            assert (g - want).abs().max().item() <= tol, d
            assert (want - base).abs().max().item() > 100 * tol, "the candidate must move the logits"
        b.set_direction(cases[len(ALPHAS) - 1][0])
        want = b.model(input_ids=ids).logits
        assert (wrong - want).abs().max().item() > 100 * 1e-4 * want.abs().max().item()
    b.set_direction(None)


def test_projected_directions_are_left_to_the_dense_path():
    from corp.algorithms.lowrank import LowRankDirection

    b = backend(False)
    fp = FactoredPopulation(b.model, b.perturber.params, R2)
    name, p = next((n, p) for n, p in b.perturber.params if p.dim() == 2)
    proj = LowRankDirection({name: (torch.ones(p.shape[0], 1), torch.ones(1, p.shape[1]))})
    assert fp.direction_factors(proj) is None and fp.direction_factors(Direction()) is None


def test_factored_greedy_answers_agree_with_materialised_candidates():
    b = backend(tied=True, batch_size=64)  # 32 prompts: 2 step sizes x 32 rows per generate
    prompts = [f"{i}+{3 * i % 17}=" for i in range(32)]
    fp = FactoredPopulation(b.model, b.perturber.params, R2)
    unit, _ = fp.direction_factors(M)
    gens = {i: g for i, g, _ in direction_generations(b, fp, unit, ALPHAS, prompts, 10)}
    base = b.generate(prompts, 10).texts
    agree = moved = 0
    for i, a in enumerate(ALPHAS):
        b.set_direction(M.scaled(a))
        want = b.generate(prompts, 10).texts
        agree += sum(x == y for x, y in zip(gens[i].texts, want))
        moved += sum(x != y for x, y in zip(want, base))
    b.set_direction(None)
    assert agree >= 0.99 * len(prompts) * len(ALPHAS), agree
    assert moved >= len(prompts), "the step sizes must change the answers for agreement to mean anything"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.conftest import make_char_tokenizer, make_tiny_llama

    tok = make_char_tokenizer()
    d = tmp_path_factory.mktemp("tiny-step")
    make_tiny_llama(tok, hidden=64).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _consolidate(model_dir, run, noise, monkeypatch, dense: bool, **more):
    """One `corp consolidate`; `dense`: the step search and gates on materialised weights (as before).
    Returns the report, the directions the Perturber applied and whether it built any merged M."""
    import corp.methods.consolidate.run as run_mod
    from corp.algorithms.perturb import Perturber
    from corp.algorithms.perturb.direction import Merged

    applied, built = [], []
    real_apply, real_keep = Perturber.apply, Perturber.keep_merged

    def apply(self, direction):
        if direction is not None and any(isinstance(t, Merged) for t in direction.components):
            applied.append(direction)
        return real_apply(self, direction)

    def keep(self, terms):
        terms = list(terms)
        built.extend(terms)
        return real_keep(self, terms)

    with monkeypatch.context() as mp:
        mp.setattr(Perturber, "apply", apply)
        mp.setattr(Perturber, "keep_merged", keep)
        if dense:
            mp.setattr(run_mod, "direction_factored_for", lambda ctx: None)
        cfg = tiny_consolidate_config(
            model_dir,
            run,
            reward="tests.test_step_factored:text_checksum",
            noise=noise,
            population=8,
            sigmas="0.05,0.1",
            n_probe=6,
            n_validation=6,
            max_new_tokens=6,
            alphas="0.5,1,2,4",
            quantiles="0.5",
            betas="1,10",
            gate_z=-10.0,
            **more,
        )
        report = run_mod.run_consolidate(cfg)
    return report, applied, built


def test_consolidate_on_a_low_rank_population_chooses_the_same_step_factored_and_dense(tiny_dir, tmp_path, monkeypatch):
    factored, f_applied, f_built = _consolidate(tiny_dir, tmp_path / "f", "lowrank:r=2", monkeypatch, dense=False)
    dense, d_applied, d_built = _consolidate(tiny_dir, tmp_path / "d", "lowrank:r=2", monkeypatch, dense=True)
    fc, dc = factored["corp"], dense["corp"]
    table_f = [(r["candidate"], r["probe_score"]) for r in fc["probe_table"]]
    table_d = [(r["candidate"], r["probe_score"]) for r in dc["probe_table"]]
    assert len(table_f) == 1 + 2 * 2 * 4  # base + 2 rules x 2 betas x 4 step sizes
    assert table_f == table_d, "every candidate's probe reward must be the dense path's"
    scores = {s for _, s in table_f}
    assert len(scores) >= 3, "the rewards must tell candidates apart for the comparison to mean anything"
    assert fc["candidate"] == dc["candidate"] and fc["gate_validation"] == dc["gate_validation"]
    rf = json.loads((tmp_path / "f" / "recipe.json").read_text())
    rd = json.loads((tmp_path / "d" / "recipe.json").read_text())
    assert rf["components"] == rd["components"]
    # the factored run materialised the chosen model once (to save it) and built no M in advance
    assert len(f_applied) == 1 and not f_built
    assert len(d_applied) >= 16 and d_built
    rows = [json.loads(line) for line in (tmp_path / "f" / "evals.jsonl").read_text().splitlines()]
    cands = [r for r in rows if r["kind"] == "direction" and r["split"] in ("probe", "validation")]
    assert len(cands) >= 16 and all(r.get("scoring") == "factored" for r in cands)
    # RandOpt's rows of the report (the top specialists on test) are scored in the batched pass too
    tops = [r for r in rows if r["kind"] == "specialist" and r["split"] == "test"]
    assert tops and all(r.get("scoring") == "factored" for r in tops)
    d_rows = {r["key"]: r for r in map(json.loads, (tmp_path / "d" / "evals.jsonl").read_text().splitlines())}
    for r in cands:  # the same keys (and here the same answers) as the dense path's rows
        assert d_rows[r["key"]]["answers"] == r["answers"]


def test_full_rank_runs_keep_the_dense_path(tiny_dir, tmp_path, monkeypatch):
    report, applied, built = _consolidate(tiny_dir, tmp_path / "full", "full", monkeypatch, dense=False)
    assert built and len(applied) >= 16, "full-rank candidates are materialised as before"
    rows = [json.loads(line) for line in (tmp_path / "full" / "evals.jsonl").read_text().splitlines()]
    assert not any(r.get("scoring") == "factored" for r in rows)


def test_stage2_rounds_on_a_low_rank_population_match_the_dense_path(tiny_dir, tmp_path, monkeypatch):
    """Stage 2's candidates are centre + t m (two merged terms) and its local specialists centre + p
    (plain components): the factored pass draws their factors per direction; rewards must match."""
    more = dict(rounds=1, local_population=4, pcs=1)
    factored, *_ = _consolidate(tiny_dir, tmp_path / "f", "lowrank:r=2", monkeypatch, dense=False, **more)
    dense, *_ = _consolidate(tiny_dir, tmp_path / "d", "lowrank:r=2", monkeypatch, dense=True, **more)
    rf, rd = factored["corp"]["stage2_rounds"], dense["corp"]["stage2_rounds"]
    assert len(rf) == 1 and rf == rd
    rows = [json.loads(line) for line in (tmp_path / "f" / "evals.jsonl").read_text().splitlines()]
    local = [r for r in rows if r["split"] == "support_select" and r["kind"] == "direction"]
    assert len(local) >= 4 + 4 and all(r.get("scoring") == "factored" for r in local)
