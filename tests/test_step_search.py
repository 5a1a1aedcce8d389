"""Step search on materialised merged directions: each merged M is built once (not once per alpha),
and the recipe CoRP writes rebuilds, bit for bit, the weights that the step search evaluated."""

import hashlib

import numpy as np
import pytest
import torch

import corp.algorithms.perturb.direction as direction_module
import corp.algorithms.perturb.workers as workers_module
from corp.algorithms.corp_operator.config import OperatorConfig
from corp.algorithms.corp_operator.stage1 import consolidate_stage1
from corp.algorithms.perturb import Component, Direction, ParamFilter, Perturber, specialist_seeds, weights_hash
from corp.algorithms.perturb.direction import Merged
from corp.algorithms.recipe import apply_recipe, make_recipe, write_recipe
from corp.errors import CorpError


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class WeightScore:
    """score(direction, split): applies the direction through a real Perturber and scores the
    model's ACTUAL weights (projection of W - W0 on a planted direction), recording a digest of the
    weights every candidate was scored with."""

    def __init__(self, model, sigma):
        self.model, self.perturber = model, Perturber(model)
        self.w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
        g = torch.Generator().manual_seed(99)
        planted = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
        norm = sum(float((t * t).sum()) for t in planted.values()) ** 0.5
        self.planted = {n: t / norm for n, t in planted.items()}
        self.sigma = sigma
        self.thresholds = {
            s: np.random.default_rng(i).normal(-1.0, 1.0, size=40)
            for i, s in enumerate(("support", "probe", "validation"))
        }
        self.seen: dict[str, str] = {}  # fingerprint of the direction -> digest of the weights it was scored with

    def __call__(self, direction, split):
        self.perturber.apply(direction)
        key = repr(direction.to_json()) if direction is not None else "base"
        self.seen[key] = weights_digest(self.model)
        proj = (
            sum(float(((p.detach() - self.w0[n]) * self.planted[n]).sum()) for n, p in self.model.named_parameters())
            / self.sigma
        )
        return [float(0.5 * proj + t > 0) for t in self.thresholds[split]]


def test_step_search_weights_are_rebuilt_bit_exactly_from_the_recipe_and_m_is_built_once(
    tmp_path, tiny_model, tiny_tokenizer, monkeypatch
):
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    base_hash = weights_hash(tiny_model)
    sigma = 0.02
    score = WeightScore(tiny_model, sigma)
    seeds = specialist_seeds(11, 24)
    rewards = [float(np.mean(score(Direction.single(s, sigma), "support"))) for s in seeds]

    calls = []
    real_noise = direction_module.noise
    monkeypatch.setattr(direction_module, "noise", lambda *a, **k: calls.append(a[0]) or real_noise(*a, **k))
    alphas = [1.0, 2.0, 4.0, 8.0]
    cfg = OperatorConfig(alphas=alphas, compat="seed-orthogonal").validate()
    params = [(n, p.shape) for n, p in tiny_model.named_parameters()]
    res = consolidate_stage1(
        rewards, seeds, [sigma] * len(seeds), params, score, cfg, progress=False, perturber=score.perturber
    )
    assert res.accepted, res.reason
    n_tensors = len(params)
    n_elite = len(res.best_stage.elite)
    # m2 and m1 are built together, each elite's noise generated once per tensor for the whole step
    # search, and the validation gates of the two best candidates reuse them (they were rebuilt, a
    # second pass over every elite's noise, until the bench showed it as a fifth of CoRP's time).
    # The old path regenerated every elite's noise for every candidate: 2 rules x 4 alphas (+ gates).
    assert len(calls) == n_elite * n_tensors, (len(calls), n_elite, n_tensors)
    # freed after their alphas and gates, but the deployed one: its test row and the saved model apply it next
    deployed = {t.components for t in res.best.direction.components if isinstance(t, Merged)}
    assert set(score.perturber._kept) == deployed, "only the deployed M stays built after the gates"
    score.perturber.release_merged()
    assert not score.perturber._kept

    evaluated = score.seen[repr(res.direction.to_json())]
    recipe = make_recipe(str(model_dir), str(model_dir), base_hash, ParamFilter(), res.direction, {"method": "corp"})
    assert "merged" in recipe["components"][0] and recipe["components"][0]["scale"] == res.best.params["alpha"]
    write_recipe(tmp_path / "recipe.json", recipe)
    out = apply_recipe(tmp_path / "recipe.json", tmp_path / "rebuilt", model=str(model_dir))
    from transformers import AutoModelForCausalLM

    rebuilt = AutoModelForCausalLM.from_pretrained(out)
    assert weights_digest(rebuilt) == evaluated, "corp apply must rebuild exactly the weights the step search evaluated"
    # and not by accident: the old per-component arithmetic (alpha folded into each coef) gives other bits
    flat = Direction(res.direction.seed_components())
    Perturber(rebuilt).apply(flat)
    assert weights_digest(rebuilt) != evaluated


def test_merged_term_arithmetic_json_and_kept_m():
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    twin = copy.deepcopy(model)
    comps = (Component(1, 0.01, 0.3), Component(2, 0.02, -0.7), Component(3, 0.01, 0.0))
    d = Direction.merged(comps).scaled(2.5)
    assert d.components == [Merged(2.5, comps)]
    assert Direction.from_json(d.to_json()) == d
    with pytest.raises(CorpError, match="neither a component"):
        Direction.from_json([{"scale": 1.0}])
    pert = Perturber(model)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    pert.apply(d)
    for n, p in model.named_parameters():
        M = torch.zeros_like(w0[n])
        for c in comps[:2]:
            M += direction_module.noise(c.seed, n, M.shape) * (c.coef * c.sigma)
        assert torch.equal(p.detach(), w0[n] + 2.5 * M), n  # W = W0 + round(alpha * M), M summed first
    assert set(pert._kept) == {comps}, "M is kept for the next alpha"
    pert.apply(d.scaled(2.0))
    assert set(pert._kept) == {comps}
    pert.apply(Direction.single(5, 0.1))
    assert pert._kept == {}, "another direction frees it"
    # a stage-2 candidate: the centre as a cached prefix plus a merged term, same bits as from W0
    centre = Direction.merged(comps[:1], 4.0)
    cand = centre + Direction.merged(comps[1:2], 3.0)
    fresh = Perturber(twin)
    fresh.apply(cand)
    pert.cache_prefix(centre)
    pert.apply(cand)
    assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(model.parameters(), twin.parameters()))
    assert not all(torch.equal(p.detach(), w0[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("workers", [1, 3])
def test_keep_merged_builds_several_terms_in_one_pass_with_the_bits_of_materialise(monkeypatch, workers):
    # workers: tensors built one after another, or on parallel threads (each with its own
    # generator and buffers); either way every M must have the bits of materialise
    monkeypatch.setattr(workers_module, "tensor_workers", lambda numel: workers)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    k1, k2, k3 = Component(1, 0.01, 0.3), Component(2, 0.02, -0.7), Component(3, 0.01, 0.5)
    terms = [
        Merged(1.0, (k1, k2, k3)),
        Merged(1.0, (Component(2, 0.02, 0.1), Component(3, 0.01, 0.2))),  # a subsequence: shares the pass
        Merged(1.0, (Component(3, 0.01, 1.0), Component(1, 0.01, 1.0))),  # another order: built on its own
        Merged(1.0, (k1, k3, Component(4, 0.03, 0.0))),  # a zero coefficient is skipped, as in materialise
    ]
    pert = Perturber(model)
    calls = []
    real_noise = direction_module.noise
    monkeypatch.setattr(direction_module, "noise", lambda *a, **k: calls.append(a[0]) or real_noise(*a, **k))
    pert.keep_merged(terms)
    n_tensors = len(pert.params)
    assert len(calls) == (3 + 2) * n_tensors, (
        "seeds 1-3 once for the shared terms, twice more for the odd one (seed 4's coef is 0)"
    )
    for t in terms:
        for name, p in pert.params:
            assert torch.equal(
                pert._kept[t.components][name], direction_module.materialise(t.components, name, p.shape)
            ), (t, name)
    fresh = Perturber(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)))
    for t in terms:  # applying any of them (pinned: none is evicted) gives the bits of a fresh apply
        d = Direction([Merged(3.0, t.components)])
        pert.apply(d)
        fresh.base = {n: b.clone() for n, b in pert.base.items()}
        fresh.apply(d)
        assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(model.parameters(), fresh.model.parameters()))
    assert len(pert._kept) == len(terms)
    pert.release_merged()
    assert not pert._kept


def test_keep_merged_follows_each_terms_order_when_an_odd_term_came_first():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    a, b, c = Component(7, 0.01, 0.4), Component(8, 0.013, -0.9), Component(9, 0.017, 0.77)
    # the first (a repeat) is built alone but fixes the shared order c, b, a; the third must get c, b, a
    # in that order although the second term, seen first among the shared ones, starts with a
    terms = [Merged(1.0, (c, b, a, c)), Merged(1.0, (a,)), Merged(1.0, (c, b, a))]
    pert = Perturber(model)
    pert.keep_merged(terms)
    for t in terms:
        for name, p in pert.params:
            assert torch.equal(
                pert._kept[t.components][name], direction_module.materialise(t.components, name, p.shape)
            ), (t, name)
