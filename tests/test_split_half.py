"""Split-half low-rank analysis: hand-computed statistics, a planted low-rank signal is recovered,
and the permutation null is calibrated (no signal -> r* = 0 almost everywhere)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from corp import CorpError
from corp.analysis.split_half import (
    Plan, analyze_population, low_rank_factors, pair_stats, project_low_rank, reproducible_ranks,
    subspace_overlap, summarise, top_svd, write_outputs,
)
from corp.perturb import noise, specialist_seeds
from tests.conftest import make_char_tokenizer, make_tiny_llama

RANKS = (1, 2, 4, 8, 16, 32)
PLANTED = {"model.layers.0.mlp.down_proj.weight": 2, "model.layers.1.self_attn.q_proj.weight": 2}


def test_overlap_equals_hand_computed_value():
    # U_A spans e1, e2; U_B spans e1 and (e2 + e3)/sqrt(2): ||U_A^T U_B||_F^2 = 1 + 1/2
    m = 5
    UA = torch.zeros(m, 2)
    UA[0, 0] = UA[1, 1] = 1
    UB = torch.zeros(m, 2)
    UB[0, 0] = 1
    UB[1, 1] = UB[2, 1] = 1 / math.sqrt(2)
    assert subspace_overlap(UA, UB, 1) == pytest.approx(1.0)
    assert subspace_overlap(UA, UB, 2) == pytest.approx(1.5 / 2)
    UB2 = UB.clone()
    UB2[:, 0] = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0])  # orthogonal to U_A's first vector
    assert subspace_overlap(UA, UB2, 1) == pytest.approx(0.0)


def test_pair_stats_match_explicit_construction():
    # G_A = 3 u1 v1^T + 1 u2 v2^T ; G_B = 2 u1 v1^T + 2 u3 v3^T with orthonormal u's and v's
    m, n = 6, 5
    U, _ = torch.linalg.qr(torch.randn(m, 3, generator=torch.Generator().manual_seed(1)))
    V, _ = torch.linalg.qr(torch.randn(n, 3, generator=torch.Generator().manual_seed(2)))
    GA = 3 * torch.outer(U[:, 0], V[:, 0]) + 1 * torch.outer(U[:, 1], V[:, 1])
    GB = 2 * torch.outer(U[:, 0], V[:, 0]) + 2.5 * torch.outer(U[:, 2], V[:, 2])
    GA, GB = GA[None], GB[None]
    UA, SA, VA = top_svd(GA, 2)
    UB, SB, VB = top_svd(GB, 2)
    st = pair_stats(GA, GB, UA, SA, VA, UB, SB, VB, ranks=(1, 2))
    # top-1: A's is u1, B's is u3 (2.5 > 2): overlap 0; top-2: span{u1,u2} vs span{u3,u1}: count 1
    assert st["cnt_left"][0].tolist() == pytest.approx([0.0, 1.0], abs=1e-5)
    assert st["cnt_right"][0].tolist() == pytest.approx([0.0, 1.0], abs=1e-5)
    cos = (3 * 2) / (math.sqrt(10) * math.sqrt(4 + 6.25))
    assert st["cos_raw"][0, 0].item() == pytest.approx(cos, rel=1e-5)
    # <P_1 G_A, G_B> = 3*2 -> 6 / (3 * |G_B|); <P_1 G_B, G_A> = 0
    assert st["cos_proj"][0, 0].item() == pytest.approx((6 / (3 * math.sqrt(10.25)) + 0) / 2, rel=1e-5)
    assert st["energy"][0].tolist() == pytest.approx([(9 / 10 + 6.25 / 10.25) / 2, 1.0], rel=1e-5)


def test_top_svd_exact_and_randomised_agree_with_linalg():
    G = torch.randn(2, 300, 200, generator=torch.Generator().manual_seed(0))
    G[:, :, :2] += 10 * torch.randn(2, 300, 1, generator=torch.Generator().manual_seed(1))  # a dominant direction
    U, S, V = top_svd(G, 8)  # randomised path (side > 160)
    U0, S0, Vh0 = torch.linalg.svd(G, full_matrices=False)
    assert torch.allclose(S[:, 0], S0[:, 0], rtol=1e-3)
    assert subspace_overlap(U[0], U0[0], 1) == pytest.approx(1.0, abs=1e-3)
    g = torch.randn(3, 64, 40, generator=torch.Generator().manual_seed(2))
    U, S, V = top_svd(g, 40)  # exact (Gram) path
    U0, S0, Vh0 = torch.linalg.svd(g, full_matrices=False)
    assert torch.allclose(S, S0, rtol=1e-4)
    assert torch.allclose(U @ torch.diag_embed(S) @ V.transpose(-1, -2), g, atol=1e-4)


def test_project_low_rank_is_best_rank_r():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(30, 20, generator=gen)
    P2 = project_low_rank(X, 2)
    assert torch.linalg.matrix_rank(P2).item() == 2
    S = torch.linalg.svdvals(X)
    assert torch.linalg.norm(X - P2).item() == pytest.approx(S[2:].norm().item(), rel=1e-4)  # Eckart-Young
    B, A = low_rank_factors(X, 3)
    assert B.shape == (30, 3) and A.shape == (3, 20)
    assert torch.equal(project_low_rank(X, 0), torch.zeros_like(X))
    assert torch.allclose(project_low_rank(X, 50), X, atol=1e-5)
    with pytest.raises(CorpError):
        project_low_rank(torch.randn(3), 1)


def _population(seed: int, n: int, planted: dict[str, int], named: dict, reward_noise: float = 0.3):
    """Rewards r_i = sum_W <Delta_W, eps_i[W]> + noise with Delta_W of rank k in the planted matrices."""
    gen = torch.Generator().manual_seed(1000 + seed)
    deltas = {}
    for name, k in planted.items():
        m, nn = named[name]
        U, _ = torch.linalg.qr(torch.randn(m, k, generator=gen))
        V, _ = torch.linalg.qr(torch.randn(nn, k, generator=gen))
        deltas[name] = U @ torch.diag(torch.linspace(1.0, 0.8, k)) @ V.T
    seeds = specialist_seeds(seed, n)
    sigmas = [(5e-4, 1e-3, 2e-3)[i % 3] for i in range(n)]
    rewards = np.zeros(n)
    for i, s in enumerate(seeds):
        for name, D in deltas.items():
            rewards[i] += float((D * noise(s, name, D.shape)).sum())
    rewards += reward_noise * np.random.default_rng(seed).standard_normal(n)
    return seeds, sigmas, rewards


@pytest.fixture(scope="module")
def tiny64():
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok, hidden=64, layers=2)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()], len(tok)


def test_planted_low_rank_signal_is_recovered_and_null_is_calibrated(tiny64, tmp_path):
    # Detectability: with z-scored rewards the planted rank-k block adds (N/2) s/sd per direction to
    # a half's aggregate, whose noise has spectral edge sqrt(N/2) (sqrt(m) + sqrt(n)); a direction
    # is visible above the noise (BBP) when sqrt(N/2) s/sd > (mn)^(1/4) = 8 for 64x64. Two planted
    # rank-2 blocks give s/sd ~ 0.5, so N must exceed ~500; N = 2000 puts it at ~2x the threshold.
    named, vocab = tiny64
    shapes = dict(named)
    unplanted_zero, unplanted_total = 0, 0
    for seed in (0, 1, 2):
        seeds, sigmas, rewards = _population(seed, 2000, PLANTED, shapes)
        res = analyze_population(named, seeds, sigmas, rewards, ranks=RANKS, splits=4, permutations=20, seed=seed, vocab_size=vocab, progress=False)
        r_star = {m["matrix"]: m["r_star"] for m in res["matrices"]}
        assert "model.embed_tokens.weight" not in r_star and "lm_head.weight" in res["skipped"]
        for name, k in PLANTED.items():
            assert RANKS.index(k) - 1 <= RANKS.index(r_star[name]) <= RANKS.index(k) + 1 if r_star[name] else False, (seed, name, r_star[name])
        for name, r in r_star.items():
            if name not in PLANTED:
                unplanted_total += 1
                unplanted_zero += r == 0
    assert unplanted_zero >= 0.9 * unplanted_total, (unplanted_zero, unplanted_total)
    # outputs of the last analysis: CSV, summary, plots, and the consolidation hook
    summary = summarise(res, {"model": "tiny"}, RANKS, 0.05)
    write_outputs(tmp_path, res, summary)
    for f in ("rank_analysis.csv", "rank_summary.json", "rank_overlap.png", "rank_heatmap.png"):
        assert (tmp_path / f).stat().st_size > 0
    ranks = reproducible_ranks(tmp_path)
    assert ranks == r_star
    (tmp_path / "rank_summary.json").unlink()
    assert reproducible_ranks(tmp_path) == r_star  # falls back to the CSV


def test_shuffled_rewards_give_no_structure(tiny64):
    named, vocab = tiny64
    seeds, sigmas, rewards = _population(3, 2000, PLANTED, dict(named))
    shuffled = np.random.default_rng(7).permutation(rewards)
    res = analyze_population(named, seeds, sigmas, shuffled, ranks=RANKS, splits=4, permutations=20, seed=3, vocab_size=vocab, progress=False)
    r_star = [m["r_star"] for m in res["matrices"]]
    assert sum(r == 0 for r in r_star) >= 0.9 * len(r_star), r_star
    assert all(m["r_star"] == 0 for m in res["matrices"] if m["matrix"] in PLANTED)


def test_streaming_path_matches_stacked(tiny64):
    named, vocab = tiny64
    seeds, sigmas, rewards = _population(4, 40, {}, dict(named))
    sub = [x for x in named if x[0] == "model.layers.0.mlp.down_proj.weight"]
    a = analyze_population(sub, seeds, sigmas, rewards, ranks=(1, 4), splits=2, permutations=3, seed=0, progress=False)
    b = analyze_population(sub, seeds, sigmas, rewards, ranks=(1, 4), splits=2, permutations=3, seed=0, budget_bytes=64 * 128 * 4 * 4, progress=False)
    assert a["matrices"][0]["stacked"] and not b["matrices"][0]["stacked"]
    assert b["matrices"][0]["noise_draws"] > a["matrices"][0]["noise_draws"] == 40
    for ra, rb in zip(a["matrices"][0]["rows"], b["matrices"][0]["rows"]):
        for k in ("overlap", "marginal", "cos_raw", "cos_proj", "energy", "overlap_p"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), k


def test_odd_population_and_bad_input():
    named = [("w.weight", (20, 12)), ("norm.weight", (12,))]
    res = analyze_population(named, list(range(9)), [1e-3] * 9, list(np.arange(9.0)), ranks=(1, 2), splits=2, permutations=3, progress=False)
    assert [m["matrix"] for m in res["matrices"]] == ["w.weight"]  # 1-D norms skipped
    assert len(Plan.make(np.arange(9.0), 2, 3, 0).group_rows(0)) == 1 + 2 * 2  # odd N: explicit B rows
    with pytest.raises(CorpError, match="rewards are equal"):
        analyze_population(named, [1, 2, 3, 4], [1e-3] * 4, [0.5] * 4, progress=False)
    with pytest.raises(CorpError, match="at least 4"):
        analyze_population(named, [1, 2, 3], [1e-3] * 3, [0.1, 0.2, 0.3], progress=False)
    with pytest.raises(CorpError, match="no weight matrix"):
        analyze_population(named, [1, 2, 3, 4], [1e-3] * 4, [0.1, 0.2, 0.3, 0.4], matrices="nothing", progress=False)


def test_reproducible_ranks_without_outputs_is_one_line_error(tmp_path):
    with pytest.raises(CorpError, match="analyze-rank"):
        reproducible_ranks(tmp_path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run", "/nonexistent-run"], "has no population.jsonl"),
        (["--run", "/nonexistent-run", "--permutations", "5"], "nothing could pass"),
        (["--ranks", "0,2"], "--ranks must be integers >= 1"),
    ],
)
def test_cli_bad_input_is_one_line_error(args, message, tmp_path):
    from tests.test_cli import corp

    res = corp("analyze-rank", *args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    err = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and message in err[0], res.stderr
