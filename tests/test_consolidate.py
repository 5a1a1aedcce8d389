"""CoRP: the operator on a controlled problem, the gate, exact vs seed-orthogonal compatibility,
and the whole `consolidate` pipeline on a tiny model saved to disk (recipe, model/, corp apply)."""

import json
import math

import numpy as np
import pytest
import torch

from corp.algorithms.corp_operator.algebra import gram_matrix
from corp.algorithms.corp_operator.config import OperatorConfig
from corp.algorithms.corp_operator.gate import paired_gate
from corp.algorithms.corp_operator.merge_rules import MERGE_RULES
from corp.algorithms.corp_operator.stage1 import consolidate_stage1, stage1
from corp.algorithms.perturb import SCHEME_VERSION, Direction, noise, specialist_seeds
from corp.methods.consolidate.config import ConsolidateConfig
from corp.methods.consolidate.stage2 import consolidate_stage2
from tests.conftest import REPO, tiny_consolidate_config


class PlantedProblem:
    """A reward that is a known function of the weights: example j of a split is solved when the
    update's projection on a planted direction, in units of sigma, beats a threshold t_j.
    `flip` makes a split prefer the opposite direction (a candidate built to hurt it)."""

    def __init__(self, model, sigma=0.02, flip=(), seed=0):
        g = torch.Generator().manual_seed(1234)
        self.params = [(n, p.shape) for n, p in model.named_parameters()]
        planted = {n: torch.randn(tuple(s), generator=g) for n, s in self.params}
        norm = math.sqrt(sum(float((t * t).sum()) for t in planted.values()))
        self.planted = {n: t / norm for n, t in planted.items()}
        self.sigma, self.flip = sigma, set(flip)
        rng = np.random.default_rng(seed)
        self.thresholds = {s: rng.normal(-1.0, 1.0, size=40) for s in ("support", "probe", "validation", "test")}
        self.calls = []

    def projection(self, direction):
        if direction is None or not direction.components:
            return 0.0
        return sum(float((direction.delta(n, s) * self.planted[n]).sum()) for n, s in self.params) / self.sigma

    def __call__(self, direction, split):
        self.calls.append(split)
        proj = self.projection(direction) * (-1.0 if split in self.flip else 1.0)
        return [float(0.5 * proj + t > 0) for t in self.thresholds[split]]


def population(problem, n=48, sigma=0.02):
    seeds = specialist_seeds(7, n)
    rewards = [float(np.mean(problem(Direction.single(s, sigma), "support"))) for s in seeds]
    return seeds, [sigma] * n, rewards


def test_consolidation_raises_held_out_reward_on_planted_problem(tiny_model):
    problem = PlantedProblem(tiny_model)
    seeds, sigmas, rewards = population(problem)
    res = consolidate_stage1(
        rewards, seeds, sigmas, problem.params, problem, OperatorConfig(alphas=[1, 2, 4, 8]).validate(), progress=False
    )
    assert res.accepted, res.reason
    base_test, cand_test = np.mean(problem(None, "test")), np.mean(problem(res.direction, "test"))
    assert cand_test > base_test + 0.15, (base_test, cand_test)
    assert problem.projection(res.direction) > 0
    assert "test" not in problem.calls[:-2], "test data must not be used for selection"


def test_gate_rejects_a_candidate_that_hurts_held_out_data_and_abstains(tiny_model):
    problem = PlantedProblem(tiny_model, flip={"validation"})
    seeds, sigmas, rewards = population(problem)
    res = consolidate_stage1(
        rewards, seeds, sigmas, problem.params, problem, OperatorConfig(alphas=[1, 2, 4, 8]).validate(), progress=False
    )
    assert not res.accepted
    assert res.direction.components == [], "abstaining must deploy the base"
    assert "abstaining" in res.reason and res.gate.lcb <= 0
    assert res.best.probe_score > np.mean(problem(None, "probe")), "the rejected candidate did look good on probe"


def test_paired_gate_statistics():
    g = paired_gate([1, 1, 0, 1], [0, 1, 0, 0], z=1.0)
    d = [1, 0, 0, 1]
    mean, sd = 0.5, math.sqrt(sum((x - 0.5) ** 2 for x in d) / 3)
    assert g.mean_diff == mean and abs(g.sd_diff - sd) < 1e-12 and abs(g.lcb - (mean - sd / 2)) < 1e-12
    assert g.accepted
    assert not paired_gate([1, 0], [0, 1]).accepted, "no gain: reject"
    assert not paired_gate([1], [0]).accepted, "one example cannot pass the gate"


def test_exact_vs_seed_orthogonal_compat_close_for_large_tensors_and_reported():
    seeds = specialist_seeds(3, 8)
    rewards = np.linspace(0, 1, 8)
    sig = np.full(8, 0.01)
    out = {}
    for label, params in (("large", [("w", (1000, 1000))]), ("small", [("w", (4, 4))])):
        dim = int(np.prod(params[0][1]))
        G = gram_matrix(params, seeds, progress=False)
        Gp_exact = np.outer(sig, sig) * G
        Gp_apx = np.diag(sig**2 * dim)
        st = stage1(rewards, 0.0, 5.0, Gp_exact, Gp_apx)
        out[label] = st.to_dict([Direction.single(s, 0.01) for s in seeds])["compat_disagreement"]
        # the Gram diagonal is |eps|^2 ~ dim; off-diagonals ~ sqrt(dim)
        assert abs(np.diag(G).mean() / dim - 1) < 0.5
    assert out["large"]["max_abs_alignment_diff"] < 0.01
    assert out["small"]["max_abs_alignment_diff"] > out["large"]["max_abs_alignment_diff"]


def _small_gram():
    """Five seeds, two tensors, and their Gram matrix summed directly in fp64."""
    seeds = specialist_seeds(5, 5)
    params = [("a", (30, 20)), ("b", (7,))]
    direct = np.zeros((5, 5))
    for n, s in params:
        E = torch.stack([noise(x, n, s).flatten().double() for x in seeds])
        direct += (E @ E.T).numpy()
    return seeds, params, direct


def test_gram_matrix_in_column_pieces_equals_direct():
    seeds, params, direct = _small_gram()
    assert np.allclose(gram_matrix(params, seeds, progress=False), direct)
    assert np.allclose(gram_matrix(params, seeds, memory_gb=12 * 5 * 32 / 2**30, progress=False), direct), (
        "pieces of 32 columns"
    )


def test_the_gram_draws_each_seeds_noise_once_per_tensor(monkeypatch):
    """Planted: the row-block Gram drew a block's noise again for every pair of blocks (4 seeds in blocks of 1:
    10 draws of a tensor; the 1.5B model's two 233M-element matrices, 94 elites: 3 hours a seed). Now each
    seed's stream is seeded once per tensor however narrow the pieces, and G is the direct sum."""
    import sys

    noise_module = sys.modules["corp.algorithms.perturb.noise"]  # the package's `noise` is the function

    seeded = []
    real = noise_module.seed_generator

    def counting(gen, key, scheme):
        seeded.append(key)
        return real(gen, key, scheme)

    monkeypatch.setattr(noise_module, "seed_generator", counting)
    seeds = [11, 12, 13, 14]
    params = [("w", torch.Size([20, 30]))]  # 600 elements: pieces of 16 at this budget (38 pieces)
    G = gram_matrix(params, seeds, memory_gb=12 * 4 * 16 / 2**30, progress=False)
    assert len(seeded) == 4 and len(set(seeded)) == 4, f"{len(seeded)} seedings for 4 seeds"
    E = torch.stack([noise(x, "w", (20, 30)).flatten().double() for x in seeds])
    assert np.allclose(G, (E @ E.T).numpy(), rtol=1e-12)


def test_gram_pieces_stay_within_the_memory_budget_and_keep_g():
    from corp.algorithms.corp_operator.algebra import gram_piece

    budget = 2 * 2**30  # the default 2 GB
    assert gram_piece(8, budget) == 1 << 20  # small populations: the 1M chunk it always summed over (same bits)
    assert gram_piece(64, budget) == 1 << 20
    for k in (192, 500, 5000):  # L's population, CoRP's regime and the mission's populations
        assert 12 * k * gram_piece(k, budget) <= budget < 12 * k * (1 << 20)  # bounded where 1M would not be
    assert gram_piece(10**9, budget) == 16  # never under torch's randn group
    # G is the same sum in other pieces: a budget that forces pieces of 16 on 600-element rows
    seeds, params, direct = _small_gram()
    assert np.allclose(gram_matrix(params, seeds, memory_gb=1000 / 2**30, progress=False), direct)


def test_gram_matrix_has_the_same_bits_on_parallel_workers(monkeypatch):
    # tensors are computed on workers, largest first, but must be added to G in parameter order:
    # G has the bits of the plain loop whatever the number of workers (a recipe's weights come from it)
    seeds = specialist_seeds(6, 7)
    params = [("s", (3,)), ("a", (40, 30)), ("b", (9, 7)), ("c", (1000,)), ("d", (5, 5, 4))]
    direct = torch.zeros((7, 7), dtype=torch.float64)
    for n, s in params:
        E = torch.stack([noise(x, n, s).flatten() for x in seeds]).double()
        direct += E @ E.T
    for workers in (1, 3):
        monkeypatch.setattr("corp.algorithms.perturb.workers.tensor_workers", lambda numel, w=workers: w)
        assert np.array_equal(gram_matrix(params, seeds, progress=False), direct.numpy()), workers


def test_stage2_rounds_are_gated_and_keep_the_stage1_result_unless_better(tiny_model):
    problem = PlantedProblem(tiny_model)
    problem.thresholds["support_select"] = problem.thresholds["support"][:20]
    problem.thresholds["support_gate"] = problem.thresholds["support"][20:]
    seeds, sigmas, rewards = population(problem, n=24)
    cfg = OperatorConfig(rounds=2, local_population=8, pcs=2, alphas="1,2,4").validate()
    first = consolidate_stage1(rewards, seeds, sigmas, problem.params, problem, cfg, progress=False)
    res = consolidate_stage2(first, problem.params, problem, cfg, progress=False)
    # rounds=2 runs both (the stop rules, two accepts or two rejects in a row, need a third)
    assert [r["round"] for r in res.rounds] == [1, 2]
    for r in res.rounds:
        assert r["pcs"] == 2 and r["n_local"] == 8
        assert r["accepted"] == (r["gate_support_half"]["accepted"] and r["gate_probe"]["accepted"])
    # a rejected round halves the local noise scale for the next one; an accepted one keeps it
    r1 = res.rounds[0]
    assert res.rounds[1]["sigma"] == (r1["sigma"] if r1["accepted"] else r1["sigma"] * 0.5)
    if not any(r["accepted"] for r in res.rounds):  # no round moved the centre: stage 1's result stands
        assert res.direction is first.direction and res.accepted == first.accepted
    if res.accepted:
        assert np.mean(problem(res.direction, "validation")) > np.mean(problem(None, "validation"))


def share_of_sevens(completions, **_):
    """A reward that is a known function of the output and moves whenever the text moves (a random
    tiny model rarely writes a '7', so the share of '7's alone is usually 0 for every specialist)."""
    return [(c.count("7") / max(1, len(c)) + (sum(map(ord, c)) % 97) / 96) / 2 for c in completions]


def test_consolidate_pipeline_saves_a_loadable_model_and_apply_rebuilds_it_bit_exactly(
    tmp_path, tiny_model, tiny_tokenizer
):
    import subprocess
    import sys

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from corp.algorithms.perturb import Perturber
    from corp.methods.consolidate.run import run_consolidate
    from tests.conftest import REPO, make_tiny_llama

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    run = tmp_path / "run"
    cfg = tiny_consolidate_config(
        model_dir,
        run,
        reward="tests.test_consolidate:share_of_sevens",
        alphas="1,2",
        top_k="1,2",
        gate_z=-10.0,  # force acceptance: this test is about what gets saved, not about the gate
    )
    report = run_consolidate(cfg)
    assert report["corp"]["accepted"], report["corp"]["reason"]
    methods = [r["method"] for r in report["test"]]
    assert methods == ["base", "randopt-top1", "randopt-vote@2", "corp"]
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["components"] and recipe["noise_scheme"] == SCHEME_VERSION and len(recipe["base_weights_hash"]) == 64
    assert "merged" in recipe["components"][0], "the deployed m2 is one merged term: M built once, scaled by alpha"

    saved = AutoModelForCausalLM.from_pretrained(run / "model").eval()
    in_memory = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    Perturber(in_memory).apply(Direction.from_json(recipe["components"]))
    ids = tiny_tokenizer("What is 12 + 7?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, in_memory(ids).logits)
        base_logits = AutoModelForCausalLM.from_pretrained(model_dir).eval()(ids).logits
        assert not torch.equal(saved(ids).logits, base_logits)

    env = {**__import__("os").environ, "CORP_NO_PROGRESS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "corp.cli", "apply", str(run / "recipe.json"), "--out", str(tmp_path / "applied")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    a, b = load_file(run / "model" / "model.safetensors"), load_file(tmp_path / "applied" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    other = tmp_path / "other"
    make_tiny_llama(tiny_tokenizer, seed=1).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "corp.cli",
            "apply",
            str(run / "recipe.json"),
            "--out",
            str(tmp_path / "x"),
            "--model",
            str(other),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 2 and "was made for base weights" in res.stderr


def test_consolidate_pipeline_abstains_when_nothing_beats_the_base(tmp_path, tiny_model, tiny_tokenizer):
    from safetensors.torch import load_file

    from corp.methods.consolidate.run import run_consolidate

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    cfg = tiny_consolidate_config(
        model_dir, tmp_path / "run", population=4, sigmas="0.01", n_support=4, max_new_tokens=4, alphas="1"
    )
    report = run_consolidate(cfg)  # a random tiny model never solves arith: every candidate ties the base
    assert not report["corp"]["accepted"] and "abstaining" in report["corp"]["reason"]
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["components"] == []
    saved = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert all(torch.equal(saved[n], p.detach()) for n, p in tiny_model.named_parameters())


def test_gate_states_its_one_sided_confidence_level():
    from corp.algorithms.corp_operator.gate import confidence_level
    from corp.config import field_docs

    g = paired_gate([1, 1, 0, 1], [0, 1, 0, 0], z=1.0)
    assert abs(g.confidence - 0.8413) < 1e-4 and abs(confidence_level(1.645) - 0.95) < 1e-3
    assert "z = 1, one-sided 84%" in g.reason, g.reason
    assert "one-sided 95%" in paired_gate([1, 0, 1], [0, 0, 1], z=1.645).reason
    assert (
        "84%" in field_docs(ConsolidateConfig)["gate_z"] and "1 time in 6" in field_docs(ConsolidateConfig)["gate_z"]
    ), "--gate-z help says what z means"


def test_paired_gate_refuses_scores_of_different_examples():
    from corp.algorithms.corp_operator.stage1 import gate_on
    from corp.errors import CorpError

    ids = ["e1", "e2", "e3", "e4"]
    assert paired_gate([1, 1, 0, 1], [0, 1, 0, 0], candidate_ids=ids, base_ids=list(ids)).accepted
    with pytest.raises(CorpError, match="different examples"):
        paired_gate(
            [1, 1, 0, 1], [0, 1, 0, 0], candidate_ids=ids, base_ids=["e1", "e3", "e2", "e4"]
        )  # same set, other order
    with pytest.raises(CorpError, match="candidate has 2 and the base 1"):
        paired_gate([1, 0], [0])

    class StaleBase:
        """The cache defect this guards: the base row came from other validation examples."""

        def __call__(self, direction, split):
            return [1.0, 0.0, 1.0] if direction is not None else [0.0, 0.0, 1.0]

        def example_ids(self, direction, split):
            return ["v1", "v2", "v3"] if direction is not None else ["old1", "old2", "old3"]

    with pytest.raises(CorpError, match="different examples"):
        gate_on(StaleBase(), Direction.single(1, 0.1), None, "validation", 1.0)


def test_merge_rules_are_a_registry_and_the_report_compares_pass1_with_pass2():
    from corp.algorithms.corp_operator.merge_rules import MERGE_RULES
    from corp.errors import CorpError

    assert {"pass1", "pass2"} <= set(MERGE_RULES)
    with pytest.raises(CorpError, match="registered rules"):
        OperatorConfig(merge_rules="pass2,nope").validate()
    rewards = np.array([0.1, 0.4, 0.5, 0.9, 0.2, 0.6])
    sig = 0.01
    seeds = specialist_seeds(3, 6)
    G = gram_matrix([("w", (20, 10))], seeds, progress=False) * sig**2
    st = stage1(rewards, 0.0, 5.0, G, np.diag(np.full(6, sig**2 * 200)), rules=("pass1",))
    assert set(st.weights) == {"pass1"}, "only the configured rules (pass 1 always: compat terms are relative to m1)"
    st = stage1(rewards, 0.0, 5.0, G, np.diag(np.full(6, sig**2 * 200)))
    d = st.to_dict([Direction.single(s, sig) for s in seeds])
    w1, w2 = np.array(d["w1"]), np.array(d["w2"])
    vs = d["vs_pass1"]["pass2"]
    assert vs["weights_l1_diff"] == pytest.approx(np.abs(w1 - w2).sum())
    assert vs["norm_ratio"] == pytest.approx(np.sqrt(w2 @ G @ w2 / (w1 @ G @ w1)))
    assert (
        -1 <= vs["cosine"] <= 1
        and d["compat_disagreement"]["w2_l1_diff"] == d["compat_disagreement"]["weights_l1_diff"]["pass2"]
    )


COMMITTED = REPO / "results" / "consolidate-smollm2-arith"
ELITE_GRAM = REPO / "tests" / "data" / "consolidate_smollm2_arith_elite_gram.json"


def committed_stage1():
    """The committed population (sorted as `corp consolidate` sorts it), recipe, report and chosen (q, beta, alpha)."""
    import re

    rows = [json.loads(line) for line in (COMMITTED / "population.jsonl").read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: f"{int(r['seed'])}:{float(r['sigma'])!r}:support")
    recipe = json.loads((COMMITTED / "recipe.json").read_text())
    report = json.loads((COMMITTED / "report.json").read_text())
    q, beta, alpha = (
        float(x) for x in re.fullmatch(r"m2 q=(\S+) beta=(\S+) alpha=(\S+)", recipe["made_by"]["candidate"]).groups()
    )
    return rows, recipe, report, q, beta, alpha


def test_committed_stage1_coefficients_recompute_from_population_and_recipe():
    """Behaviour stays: the committed CoRP recipe (made before the merge-rule registry) is stage 1's
    m2 at the chosen (q, beta), times alpha. Pass 1 needs no Gram matrix and must match exactly; pass 2
    with the exact Gram matrix (stored in tests/data, recomputed by the embedded test below) must
    match the recipe to fp64 rounding; the seed-orthogonal approximation must differ from it by exactly
    the L1 distance the report printed (7.9e-4), which pins that path too."""
    from corp.algorithms.corp_operator.algebra import perturbation_grams

    rows, recipe, report, q, beta, alpha = committed_stage1()
    r = np.array([x["reward"] for x in rows])
    perts = [Direction.single(x["seed"], x["sigma"]) for x in rows]
    _, G_apx = perturbation_grams(
        perts, [("all", (report["corp"]["consolidation_ledger"]["n_params"],))], None, 2.0, False
    )
    stored = json.loads(ELITE_GRAM.read_text())
    G = np.zeros_like(G_apx)
    G[np.ix_(stored["elite_index"], stored["elite_index"])] = np.array(stored["gram"])
    st = stage1(r, q, beta, G, G_apx)
    coef = np.array([c["coef"] for c in recipe["components"]])
    assert [rows[i]["seed"] for i in st.elite] == [c["seed"] for c in recipe["components"]] == stored["seeds"]
    assert [rows[i]["sigma"] for i in st.elite] == [c["sigma"] for c in recipe["components"]]
    chosen = next(s for s in report["corp"]["stage1"] if s["q"] == q and s["beta"] == beta)
    assert np.array_equal(st.w1, np.array(chosen["w1"]))
    assert np.allclose(alpha * st.w2, coef, rtol=1e-12, atol=0), np.abs(alpha * st.w2 - coef).max()
    apx = st.weights_approx["pass2"]
    assert abs(np.abs(apx - coef / alpha).sum() - chosen["compat_disagreement"]["w2_l1_diff"]) < 1e-12
    vs = st.to_dict(perts)["vs_pass1"]["pass2"]  # what the results README now states
    assert abs(vs["weights_l1_diff"] - 0.380) < 1e-3 and abs(vs["norm_ratio"] - 1.66) < 5e-3


@pytest.mark.embedded
def test_committed_elite_gram_recomputes_from_the_embedded_models_noise():
    """The stored Gram matrix is what corp computes from SmolLM2-135M's tensor shapes under
    corp-noise-v1. All 41 elites take about 4 CPU-minutes on an idle core (41 x 134.5M normals and
    their products), so this checks a block of 5 of them (about 30 s); the whole matrix was checked
    once by hand (notes)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from corp.algorithms.corp_operator.algebra import perturbation_grams
    from corp.runtime.models import resolve_model

    stored = json.loads(ELITE_GRAM.read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model(stored["model"])[1]))
    params = [(n, p.shape) for n, p in model.named_parameters()]
    pick = [0, 1, 17, 39, 40]
    perts = [Direction.single(stored["seeds"][i], stored["sigmas"][i]) for i in pick]
    G, _ = perturbation_grams(perts, params, list(range(len(perts))), 2.0, False, None, stored["noise_scheme"])
    want = np.array(stored["gram"])[np.ix_(pick, pick)]
    # fp64 sums over 134.5M terms: equal up to the summation order (BLAS threads), far below any weight's scale
    assert np.allclose(G, want, rtol=0, atol=1e-12 * np.abs(np.diag(want)).max())


def test_a_new_merge_rule_is_one_registry_entry(tiny_model, monkeypatch):
    """A rule registered like pass1/pass2 is searched, gated and deployed when listed first, with no
    other change (here: plain mean of the elites, beta ignored)."""
    from corp.algorithms.corp_operator.merge_rules import MERGE_RULES, MergeRule

    monkeypatch.setitem(
        MERGE_RULES, "uniform", MergeRule("uniform", "mu", lambda r, G, p: np.full(len(r), 1.0 / len(r)))
    )
    problem = PlantedProblem(tiny_model)
    seeds, sigmas, rewards = population(problem, n=16)
    cfg = OperatorConfig(merge_rules="uniform,pass2", alphas=[2, 4]).validate()
    res = consolidate_stage1(rewards, seeds, sigmas, problem.params, problem, cfg, progress=False)
    assert res.best.name.startswith("mu q=0.5") and set(res.rule_gates) == {"uniform", "pass2"}
    st = res.stage1[0]
    assert np.allclose(st["weights"]["uniform"], 1.0 / len(st["w1"])) and "uniform" in st["vs_pass1"]
    assert [row["pass"] for row in res.probe_table].count("mu") == 2
    merged = res.best.direction.components[0]
    assert (
        np.allclose([c.coef for c in merged.components], 1.0 / len(st["w1"]))
        and merged.scale == res.best.params["alpha"]
    )


def test_reward_scale_keeps_unit_rewards_and_maps_other_scales_to_unit_range():
    """beta acts on raw rewards: a TRL-style reward on another scale (here 0..100, or negative)
    must give the same softmax weights as the same ranking on [0, 1]; unit rewards are untouched."""
    import numpy as np

    from corp.algorithms.corp_operator.stage1 import reward_scale

    unit = [0.25, 0.5, 0.75]
    assert reward_scale(unit).tolist() == unit  # built-in tasks: exactly as before
    np.testing.assert_allclose(reward_scale([0.0, 50.0, 100.0]), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(reward_scale([-3.0, -1.0, 1.0]), [0.0, 0.5, 1.0])
    assert reward_scale([7.0, 7.0]).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("rule", sorted(MERGE_RULES))
def test_every_registered_merge_rule_weights_the_elites(rule):
    """Every entry of the merge-rule registry (a new rule is covered without editing this test): one
    finite weight per elite, the same weights for the same inputs, found under its own name."""
    from corp.algorithms.corp_operator.merge_rules import MergeParams

    g = np.random.default_rng(0)
    rewards = g.random(6)
    A = g.standard_normal((6, 40))
    G = A @ A.T
    w = np.asarray(MERGE_RULES[rule].weights(rewards, G, MergeParams(q=0.5, beta=5.0)), dtype=np.float64)
    assert w.shape == (6,) and np.all(np.isfinite(w))
    assert np.array_equal(
        w, np.asarray(MERGE_RULES[rule].weights(rewards, G, MergeParams(q=0.5, beta=5.0)), dtype=np.float64)
    )
    assert MERGE_RULES.lookup(rule).name == rule


def _six_and_three():
    """Issue 55's seed-2 gate: the candidate right on 6 validation examples the base got wrong, wrong on 3 the
    base got right, of 64; its lower bound is exactly 0, so the gate kept the base."""
    candidate = [1] * 6 + [0] * 3 + [1] * 10 + [0] * 45
    base = [0] * 6 + [1] * 3 + [1] * 10 + [0] * 45
    return paired_gate(candidate, base, z=1.0)


def test_the_gate_states_its_margin_wins_and_losses_of_n():
    from corp.algorithms.corp_operator.gate import margin, margin_line

    g = _six_and_three()
    assert (g.wins, g.losses, g.n, g.accepted) == (6, 3, 64, False)
    m = margin(g.to_dict())
    assert m["kept_base"] and m["decision"] == "kept the base" and m["gate_z"] == 1.0
    assert (m["wins"], m["losses"], m["lcb"]) == (6, 3, 0.0) and abs(m["mean_diff"] - 3 / 64) < 1e-12
    line = margin_line(g.to_dict())
    assert "won 6 and lost 3 of 64 examples" in line and "lower bound +0.0000" in line, line
    assert "gate_z = 1" in line and line.endswith("kept the base")
    old = {k: v for k, v in g.to_dict().items() if k not in ("wins", "losses")}  # a recipe written before issue 55
    assert "n = 64" in margin_line(old) and "wins" not in margin(old)


def test_the_card_states_the_gates_margin_and_what_it_kept_out():
    from corp.cards import _weights_lines

    g = _six_and_three()
    recipe = {"made_by": {"method": "corp", "accepted": False, "reason": g.reason, "gate": g.to_dict()}}
    report = {"corp": {"candidate_test": {"candidate": "m2 q=0.5 beta=10 alpha=8", "deployed": False,
                                          "accuracy": 0.31, "base_accuracy": 0.137}}}  # fmt: skip
    text = "\n".join(_weights_lines("consolidate", recipe, report))
    assert "Gate (validation): the candidate won 6 and lost 3 of 64 examples" in text, text
    assert "lower bound +0.0000 (gate_z = 1): kept the base." in text
    assert "kept out ('m2 q=0.5 beta=10 alpha=8') scored 0.310 on test vs the base's 0.137" in text


def test_an_abstaining_run_reports_the_gates_margin_and_its_candidates_test_score(tmp_path, tiny_model, tiny_tokenizer):
    from corp.methods.consolidate.run import run_consolidate

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    run = tmp_path / "run"
    cfg = tiny_consolidate_config(
        model_dir, run, reward="tests.test_consolidate:share_of_sevens", alphas="1,2", gate_z=50.0
    )  # z = 50: the gate keeps the base
    report = run_consolidate(cfg)
    corp = report["corp"]
    assert not corp["accepted"] and corp["gate"]["kept_base"] and corp["gate"]["decision"] == "kept the base"
    g = corp["gate_validation"]
    assert (corp["gate"]["wins"], corp["gate"]["losses"]) == (g["wins"], g["losses"]) and g["n"] == 4
    cand = corp["candidate_test"]
    assert cand["candidate"] == corp["candidate"] and cand["deployed"] is False
    base = next(r for r in report["test"] if r["method"] == "base")
    assert cand["base_accuracy"] == base["accuracy"] and 0.0 <= cand["accuracy"] <= 1.0
    on_disk = json.loads((run / "report.json").read_text())["corp"]
    assert {"accepted", "reason", "candidate", "gate_validation", "gate", "candidate_test"} <= set(on_disk)
    assert f"won {g['wins']} and lost {g['losses']} of 4 examples" in report["table"], report["table"]
    assert "the candidate the gate kept out" in report["table"]
    card = (run / "model" / "README.md").read_text()
    assert f"Gate (validation): the candidate won {g['wins']} and lost {g['losses']} of 4" in card
    assert "The candidate the gate kept out" in card


def test_consolidate_says_its_later_passes_and_their_time_once_the_population_is_scored(
    tmp_path, tiny_model, tiny_tokenizer, monkeypatch, capsys
):
    """After the population, the step search, the gates and the test rows ran with no estimate (issue 56):
    one line now says their passes, stage by stage, at the population's rate, before the step search starts;
    a rerun, whose rows are all cached, says none."""
    import re

    from corp.methods.consolidate.run import run_consolidate

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    cfg = dict(reward="tests.test_consolidate:share_of_sevens", alphas="1,2", top_k="1,2")
    monkeypatch.delenv("CORP_NO_PROGRESS", raising=False)
    run_consolidate(tiny_consolidate_config(model_dir, tmp_path / "run", **cfg))
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("consolidate: ")]
    # 2 rules x 2 alphas + the base on probe; each rule's best + the base on validation; base, top 2, CoRP on test
    assert len(said) == 1 and re.match(
        r"consolidate: 12 passes to go, about \d+ s \(step search 5, gates 3, test rows 4; "
        r".* s per example, at the population's rate\)$",
        said[0],
    ), said
    assert err.index(said[0]) < err.index("step search (probe)"), "said before the step search starts"
    run_consolidate(tiny_consolidate_config(model_dir, tmp_path / "run", **cfg))
    assert "consolidate: " not in capsys.readouterr().err


def test_the_deployed_m_is_built_once_from_the_step_search_to_the_saved_model(
    tmp_path, tiny_model, tiny_tokenizer, monkeypatch
):
    """The deployed rule's M stays built from its gate through the test rows and the saved model (issue 56: the
    test row rebuilt it, 8 s of the quick start's 362): no merged tensor is materialised on demand."""
    import corp.algorithms.perturb.direction as direction_module
    from corp.methods.consolidate.run import run_consolidate

    built = []
    real = direction_module.materialise
    monkeypatch.setattr(direction_module, "materialise", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    cfg = tiny_consolidate_config(
        model_dir, tmp_path / "run", reward="tests.test_consolidate:share_of_sevens", merge_rules="pass2", gate_z=-10.0
    )
    report = run_consolidate(cfg)
    assert report["corp"]["accepted"], report["corp"]["reason"]
    assert built == [], f"merged tensors rebuilt after the step search: {sorted(set(built))[:5]}"


def test_the_compatibility_line_compares_only_what_was_computed():
    """With the seed-orthogonal approximation there is no Gram matrix: the table says so instead of comparing the
    approximation with itself (it printed 'compatibility (seed-orthogonal) vs seed-orthogonal approximation ... 0.00e+00')."""
    from corp.methods.consolidate.run import compat_line

    chosen = {"compat_disagreement": {"max_abs_alignment_diff": 1.7e-4, "w2_l1_diff": 6.0e-4}}
    assert compat_line("exact", chosen).endswith("max |alignment diff| 1.70e-04, L1 diff of pass-2 weights 6.00e-04")
    assert compat_line("exact", None) == ""
    line = compat_line("seed-orthogonal", chosen)
    assert "no Gram matrix" in line and "diff" not in line
