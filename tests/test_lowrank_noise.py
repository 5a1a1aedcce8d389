"""Low-rank noise scheme: what a seed means, which tensors get noise, every materialisation path,
and the one-line refusals."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from corp.algorithms.corp_operator.algebra import gram_matrix
from corp.algorithms.perturb import (
    SCHEME_VERSION,
    Component,
    Direction,
    ParamFilter,
    Perturber,
    check_scheme,
    noise,
    scheme_from_flag,
    weights_hash,
)
from corp.algorithms.perturb.lowrank_noise import dense, factors
from corp.algorithms.recipe import apply_recipe, make_recipe, write_recipe
from corp.cli import app
from corp.config import RandOptConfig, load_config
from corp.errors import CorpError
from corp.evaluate.scorer import ensure_population
from corp.runtime.backends.hf import HFBackend
from corp.runtime.context import setup_run
from tests.conftest import make_char_tokenizer, make_tiny_llama

R4 = "corp-lowrank-v1:r=4"
REWARD = "tests.test_lowrank_consolidate:text_checksum"  # a reward that varies on a tiny random model


def test_flags_name_schemes_and_bad_ranks_are_one_line():
    assert scheme_from_flag("full") == SCHEME_VERSION
    assert scheme_from_flag(None) == SCHEME_VERSION
    assert scheme_from_flag("lowrank:r=4") == R4
    assert scheme_from_flag(R4) == R4
    for bad, frag in [
        ("lowrank:r=0", ">= 1"),
        ("lowrank:r=-2", ">= 1"),
        ("lowrank:r=x", "not an integer"),
        # one rank, one spelling (issue 41: int() took these, so a scheme string named a rank several ways)
        ("lowrank:r=1_0", "r=1_0' is not an integer written plainly"),
        ("lowrank:r=+4", "r=+4' is not an integer written plainly"),
        ("lowrank:r= 4", "r= 4' is not an integer written plainly"),
        ("corp-lowrank-v1:r=02", "r=02' is not an integer written plainly"),
        ("lowrank", "names no rank"),
        ("gaussian", "unknown --noise"),
        ("corp-lowrank-v9:r=4", "cannot generate"),
    ]:
        with pytest.raises(CorpError, match=re.escape(frag)) as e:
            scheme_from_flag(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(CorpError, match="recipe 'x'.*r=0"):
        check_scheme("corp-lowrank-v1:r=0", "recipe 'x'")
    with pytest.raises(CorpError, match="recipe 'x'.*r=04"):
        check_scheme("corp-lowrank-v1:r=04", "recipe 'x'")


def test_noise_is_rank_r_unit_variance_and_1d_tensors_get_none():
    E = noise(7, "model.layers.0.mlp.up_proj.weight", (64, 48), scheme=R4)
    assert torch.linalg.matrix_rank(E.double(), rtol=1e-5).item() == 4
    A, B = factors(7, "model.layers.0.mlp.up_proj.weight", (64, 48), R4)
    assert torch.allclose(E, A @ B.T / 2, atol=1e-5)
    assert torch.equal(E, noise(7, "model.layers.0.mlp.up_proj.weight", (64, 48), scheme=R4)), "a seed means one tensor"
    assert not torch.equal(E, noise(8, "model.layers.0.mlp.up_proj.weight", (64, 48), scheme=R4))
    assert not torch.equal(E, noise(7, "model.layers.1.mlp.up_proj.weight", (64, 48), scheme=R4)), (
        "each tensor its own factors"
    )
    big = torch.cat([noise(s, "w", (128, 128), scheme=R4).flatten() for s in range(20)])
    assert abs(big.var().item() - 1.0) < 0.1  # unit variance per entry, like full-rank noise
    r1 = noise(7, "w", (64, 48), scheme="corp-lowrank-v1:r=1")
    assert torch.linalg.matrix_rank(r1.double(), rtol=1e-5).item() == 1
    assert torch.equal(noise(7, "model.norm.weight", (48,), scheme=R4), torch.zeros(48))
    out = torch.full((48,), 3.0)
    assert torch.equal(noise(7, "b", (48,), out=out, scheme=R4), torch.zeros(48)), "a reused buffer is cleared"


def test_dense_noise_has_the_same_bits_on_every_thread():
    A, B = torch.randn(300, 8), torch.randn(700, 8)
    ref = dense(A, B)
    got = {}
    torch.set_num_threads(2)
    try:
        t = threading.Thread(target=lambda: (torch.set_num_threads(1), got.setdefault("x", dense(A, B))))
        t.start()
        t.join()
    finally:
        torch.set_num_threads(2)
    assert torch.equal(ref, got["x"])
    assert torch.allclose(ref, A @ B.T / 8**0.5, atol=1e-4)


def tiny():
    tok = make_char_tokenizer()
    return make_tiny_llama(tok), tok


def test_rank_larger_than_a_matrix_is_refused_when_the_perturber_is_built():
    model, _ = tiny()  # k_proj is 16 x 32 (2 kv heads of 8)
    Perturber(model, scheme="corp-lowrank-v1:r=16")
    with pytest.raises(
        CorpError,
        match=r"rank 17 is larger than the smaller side of 'model.layers.0.self_attn.k_proj.weight' \(16, 32\)",
    ):
        Perturber(model, scheme="corp-lowrank-v1:r=17")
    Perturber(
        model, ParamFilter(exclude="k_proj|v_proj"), scheme="corp-lowrank-v1:r=17"
    )  # the filter decides what must fit


def test_perturber_applies_sigma_times_dense_noise_and_restores_bits():
    model, _ = tiny()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pert = Perturber(model, scheme=R4)
    pert.apply(Direction.from_json([{"seed": 3, "sigma": 0.1, "coef": 1.0}, {"seed": 4, "sigma": 0.2, "coef": -0.5}]))
    for n, p in model.named_parameters():
        if p.dim() == 1:
            assert torch.equal(p, before[n]), f"{n}: a 1-D parameter got noise"
            continue
        want = (
            before[n]
            .clone()
            .add_(noise(3, n, p.shape, scheme=R4).mul_(0.1))
            .add_(noise(4, n, p.shape, scheme=R4).mul_(-0.5 * 0.2))
        )
        assert torch.equal(p, want), n
        delta = (p - before[n]).double()
        assert torch.linalg.matrix_rank(delta, rtol=1e-5).item() <= 8
    pert.restore()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    full = Perturber(model)  # the same seed under the full-rank scheme means other weights
    full.apply(Direction.single(3, 0.1))
    w = dict(model.named_parameters())["model.layers.0.mlp.up_proj.weight"].detach()
    assert not torch.allclose(
        w - before["model.layers.0.mlp.up_proj.weight"],
        0.1 * noise(3, "model.layers.0.mlp.up_proj.weight", w.shape, scheme=R4),
    )


def test_merged_direction_of_a_step_search_is_the_sum_of_dense_noise():
    model, _ = tiny()
    pert = Perturber(model, scheme=R4)
    comps = Direction.from_json(
        [{"seed": 3, "sigma": 0.1, "coef": 0.7}, {"seed": 9, "sigma": 0.1, "coef": 0.3}]
    ).components
    d = Direction.merged(comps, scale=2.0)
    pert.apply(d)
    a = {n: p.detach().clone() for n, p in model.named_parameters()}
    pert.restore()
    pert.apply(d.scaled(1.0))
    pert.restore()
    n = "model.layers.1.self_attn.o_proj.weight"
    M = noise(3, n, a[n].shape, scheme=R4).mul_(0.07) + noise(9, n, a[n].shape, scheme=R4).mul_(0.03)
    assert torch.allclose(a[n] - dict(model.named_parameters())[n].detach(), 2.0 * M, atol=1e-6)


def _dense_merged(comps, name, shape, scheme):
    """The dense definition of a merged term's M: each seed's whole E, scaled, added in order."""
    M = torch.zeros(shape)
    for c in comps:
        M.add_(noise(c.seed, name, shape, scheme=scheme).mul_(c.coef * c.sigma))
    return M


@pytest.mark.parametrize("scheme", [R4, "corp-lowrank-v1:r=1"])
def test_merged_low_rank_terms_are_built_from_factors_with_the_dense_bits(scheme):
    """materialise and Perturber.keep_merged build a low-rank M a row block at a time from the
    factors (merged_noise): the bits equal building every elite's dense E whole, on a matrix of
    several blocks, for two terms sharing elites, and the step search's weights are those bits."""
    from corp.algorithms.perturb.direction import Merged, materialise
    from corp.algorithms.perturb.lowrank_noise import merged_noise

    shape = (2500, 64)  # 1024 rows per block of dense(): three blocks, the last one partial
    comps = [Component(3, 0.1, 0.7), Component(9, 0.05, -0.3), Component(4, 0.1, 1.25)]
    want = _dense_merged(comps, "w", shape, scheme)
    assert torch.equal(materialise(comps, "w", shape, scheme=scheme), want)
    other = [comps[0], comps[2]]
    uses = [(3, [(0, 0.07), (1, 0.07)]), (9, [(0, -0.015)]), (4, [(0, 0.125), (1, 0.125)])]
    got = merged_noise(uses, 2, "w", shape, scheme)
    assert torch.equal(got[0], want) and torch.equal(got[1], _dense_merged(other, "w", shape, scheme))
    assert torch.equal(merged_noise([(3, [(0, 1.0)])], 1, "b", (64,), scheme)[0], torch.zeros(64)), "1-D: no noise"

    model, _ = tiny()
    W0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    pert = Perturber(model, scheme=scheme)
    terms = [Merged(1.0, tuple(comps)), Merged(1.0, tuple(other))]
    pert.keep_merged(terms)  # the step search's shared build
    for t in terms:
        for alpha in (2.0, -0.5):
            pert.apply(Direction([Merged(alpha, t.components)]))
            for n, p in model.named_parameters():
                M = _dense_merged(t.components, n, p.shape, scheme)
                assert torch.equal(p.detach(), W0[n] + torch.mul(M, alpha)), (n, alpha)
    pert.release_merged()
    pert.restore()


def test_gram_matrix_regenerates_low_rank_noise():
    params = [("a.weight", torch.Size((24, 16))), ("a.bias", torch.Size((24,)))]
    seeds = [1, 2, 3]
    G = gram_matrix(params, seeds, progress=False, scheme=R4)
    E = [noise(s, "a.weight", (24, 16), scheme=R4).flatten().double() for s in seeds]
    want = np.array([[float(x @ y) for y in E] for x in E])
    assert np.allclose(G, want, rtol=1e-6)
    assert not np.allclose(G, gram_matrix(params, seeds, progress=False))


def test_recipe_round_trip_and_unknown_rank(tmp_path):
    model, tok = tiny()
    base_dir = tmp_path / "base"
    model.save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    d = Direction.from_json([{"seed": 5, "sigma": 0.05, "coef": 1.0}])
    recipe = make_recipe(
        str(base_dir), str(base_dir), weights_hash(model), ParamFilter(), d, {"method": "test"}, scheme=R4
    )
    assert recipe["noise_scheme"] == R4
    write_recipe(tmp_path / "recipe.json", recipe)
    out = apply_recipe(tmp_path / "recipe.json", tmp_path / "out")
    Perturber(model, scheme=R4).apply(d)
    from safetensors.torch import load_file

    saved = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(saved[n], p.detach()) for n, p in model.named_parameters())
    import json

    bad = json.loads((tmp_path / "recipe.json").read_text())
    for scheme, frag in [("corp-lowrank-v1:r=0", ">= 1"), ("corp-lowrank-v1:r=four", "not an integer")]:
        bad["noise_scheme"] = scheme
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        res = CliRunner().invoke(app, ["apply", str(tmp_path / "bad.json"), "--out", str(tmp_path / "never")])
        assert res.exit_code == 2 and frag in res.output and "Traceback" not in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
        assert not (tmp_path / "never").exists()
    bad["noise_scheme"] = "corp-lowrank-v1:r=99"  # larger than every matrix of the tiny model
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    res = CliRunner().invoke(app, ["apply", str(tmp_path / "bad.json"), "--out", str(tmp_path / "never")])
    assert "rank 99 is larger" in _one_error(res)
    assert not (tmp_path / "never").exists()


def cfg(run_dir, **kw):
    base = dict(
        task="arith",
        population=3,
        sigmas="0.05",
        n_support=4,
        n_probe=0,
        n_validation=0,
        n_test=2,
        top_k="1",
        max_new_tokens=4,
        run_dir=str(run_dir),
    )
    base.update(kw)
    return load_config(RandOptConfig, None, base)


def backend(scheme=SCHEME_VERSION):
    model, tok = tiny()
    return HFBackend(model, tok, batch_size=8, scheme=scheme)


def test_population_is_not_resumed_under_another_scheme(tmp_path):
    ensure_population(setup_run(cfg(tmp_path / "lr", noise="lowrank:r=2"), "randopt", backend("corp-lowrank-v1:r=2")))
    for flag, scheme in [("full", SCHEME_VERSION), ("lowrank:r=4", "corp-lowrank-v1:r=4")]:
        with pytest.raises(CorpError, match="noise_scheme = corp-lowrank-v1:r=2"):
            setup_run(cfg(tmp_path / "lr", noise=flag), "randopt", backend(scheme))
    ensure_population(setup_run(cfg(tmp_path / "fr"), "randopt", backend()))
    with pytest.raises(CorpError, match=f"noise_scheme = {SCHEME_VERSION}"):
        setup_run(cfg(tmp_path / "fr", noise="lowrank:r=2"), "randopt", backend("corp-lowrank-v1:r=2"))
    with pytest.raises(CorpError, match="noise_scheme"):  # nor taken by --from-run under another scheme
        ensure_population(setup_run(cfg(tmp_path / "c", from_run=str(tmp_path / "lr")), "randopt", backend()))


def test_low_rank_rows_have_their_own_cache_keys(tmp_path):
    lr = ensure_population(
        setup_run(cfg(tmp_path / "lr", noise="lowrank:r=2"), "randopt", backend("corp-lowrank-v1:r=2"))
    )
    fr = ensure_population(setup_run(cfg(tmp_path / "fr"), "randopt", backend()))
    assert {r["key"] for r in lr}.isdisjoint({r["key"] for r in fr})


def test_bad_noise_flag_is_one_line_on_the_cli(tmp_path):
    res = CliRunner().invoke(app, ["randopt", "--noise", "lowrank:r=0", "--output-dir", str(tmp_path / "x")])
    assert res.exit_code == 2 and ">= 1" in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def _score_args(model, run_dir, *more):
    return [
        "score", "--model", str(model), "--task", "arith", "--population", "2", "--sigmas", "0.05",
        "--n-support", "2", "--n-probe", "0", "--n-validation", "0", "--n-test", "0",
        "--max-completion-length", "3", "--output-dir", str(run_dir), *more,
    ]  # fmt: skip


def _one_error(res) -> str:
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]  # progress bars share the stream
    assert res.exit_code == 2 and len(errors) == 1 and "Traceback" not in res.output, res.output
    return errors[0]


def test_a_rank_above_a_matrix_side_stops_a_scoring_command_with_nothing_written(tiny_dir, tmp_path):
    res = CliRunner().invoke(app, _score_args(tiny_dir, tmp_path / "x", "--noise", "lowrank:r=99"))
    assert "rank 99 is larger" in _one_error(res)
    assert not (tmp_path / "x").exists()


def test_resuming_or_reusing_a_population_under_the_other_noise_flag_is_one_line_and_changes_nothing(
    tiny_dir, tmp_path
):
    run = tmp_path / "lr"
    res = CliRunner().invoke(app, _score_args(tiny_dir, run, "--noise", "lowrank:r=2"))
    assert res.exit_code == 0, res.output
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert "population.jsonl" in before
    res = CliRunner().invoke(app, _score_args(tiny_dir, run, "--noise", "full"))
    assert "noise_scheme = corp-lowrank-v1:r=2" in _one_error(res)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    # the reverse: a full-rank population taken by --from-run under a low-rank flag
    full = tmp_path / "full"
    assert CliRunner().invoke(app, _score_args(tiny_dir, full)).exit_code == 0
    res = CliRunner().invoke(
        app,
        ["randopt", *_score_args(tiny_dir, tmp_path / "never", "--from-run", str(full), "--noise", "lowrank:r=2",
                                 "--top-k", "1", "--n-test", "2")[1:]],
    )  # fmt: skip
    assert "noise_scheme = corp-noise-v2, not corp-lowrank-v1:r=2" in _one_error(res)
    assert not (tmp_path / "never").exists()


def test_an_exact_lora_export_of_a_full_rank_run_is_refused_before_anything_is_written(tiny_dir, tmp_path):
    res = CliRunner().invoke(
        app,
        ["consolidate", "--model", str(tiny_dir), "--export-lora", "--population", "2", "--sigmas", "0.05", "--top-k", "1",
         "--output-dir", str(tmp_path / "never")],
    )  # fmt: skip
    assert "--export-lora" in _one_error(res)
    assert not (tmp_path / "never").exists()


def test_analyze_rank_on_a_low_rank_population_regenerates_the_low_rank_noise(tiny_dir, tmp_path, monkeypatch):
    """The split-half analysis rebuilds every specialist's noise per matrix: on a low-rank population it
    must be the scheme's rank-R E (full-rank noise there would analyse perturbations nobody scored)."""
    import corp.methods.analyze_rank.rank_stats as rank_stats
    from corp.methods.analyze_rank.config import AnalyzeRankConfig
    from corp.methods.analyze_rank.split_half import run_analyze_rank

    run = tmp_path / "lr"
    res = CliRunner().invoke(
        app, _score_args(tiny_dir, run, "--noise", "lowrank:r=2", "--population", "6", "--reward", REWARD)
    )
    assert res.exit_code == 0, res.output
    drawn = []
    real = rank_stats.noise

    def spy(seed, name, shape, gen, out=None, scheme=None):
        e = real(seed, name, shape, gen, out=out, scheme=scheme)
        drawn.append((scheme, int(torch.linalg.matrix_rank(e.reshape(shape).double(), rtol=1e-5))))  # fp32 rounding
        return e

    monkeypatch.setattr(rank_stats, "noise", spy)
    run_analyze_rank(
        load_config(AnalyzeRankConfig, None, dict(run=str(run), ranks="1", splits=2, permutations=19, power_sims=0))
    )
    assert drawn and {s for s, _ in drawn} == {"corp-lowrank-v1:r=2"}
    assert max(r for _, r in drawn) <= 2
