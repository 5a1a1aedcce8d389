"""Split-half low-rank analysis of a scored population (`corp analyze-rank`).

What it implements: for every weight matrix W (m x n) and rank r, do two random halves A, B of
the population, aggregated as G_A = sum_{i in A} w_i sigma_i eps_i[W] with z-scored rewards w,
share their top-r singular subspaces more than they would if rewards carried no information?
From that, a reproducible rank r* per matrix, which low-rank consolidation (METHODS.md, "Low-rank
consolidation") uses to project the merged update.

This is OUR specification. The CoRP paper (arXiv 2605.31494) reports "reproducible low-rank
structure in every case" but publishes no code for it; we implement METHODS.md, "Split-half
low-rank analysis", with these departures, each for a reason:

1. r* uses the *marginal* overlap, with a prefix rule. METHODS says "the largest r whose overlap
   beats the null". The cumulative overlap o_r = ||U_A[:, :r]^T U_B[:, :r]||_F^2 / r still
   contains the k shared directions for every r >= k, so it beats the null far beyond k (a
   planted rank-2 signal gives the cumulative rule r* = 32 in our test). We test instead the
   marginal overlap at each grid rank r (previous grid rank r'; r' = 0 for the first):
       mo_r = (r o_r - r' o_r') / (r - r'),
   the mean overlap contributed by singular directions r'+1 .. r, against its own permutation
   null, and define r* = the largest grid rank r such that the marginal test passes at r AND at
   every smaller grid rank; r* = 0 when it fails at the first rank. A failure at a smaller r
   therefore stops the search: singular directions are ordered by strength, so a "reproducible"
   direction below an irreproducible stronger one is more likely chance than structure, and the
   prefix rule keeps the per-matrix false-positive rate at the level of one test (alpha), not
   one per rank. The literal cumulative rule is still reported (`r_star_cumulative`).
2. "Beats the null" means the empirical permutation p-value (1 + #{null >= obs}) / (P + 1) is
   <= alpha (0.05). With P = 20 this requires the observed value to exceed every null value; the
   interpolated 95th percentile of 20 null draws is the 19th-20th order statistic, which a null
   statistic exceeds about 2 times in 21 (a 9.5% false-positive rate, not 5%). The null's mean
   and 95th percentile are reported as asked.
3. Weights are z-scored rewards only (the stage-1 weights w2 of CoRP are not offered: they depend
   on consolidation settings that do not exist at analysis time).
4. Vocabulary matrices (a dimension equal to the vocabulary size: embed_tokens, lm_head) are
   skipped unless --include-embeddings: for SmolLM2 that one 49152 x 576 matrix holds 21% of the
   weights and its stacked noise would be N x 113 MB, and most of its rows belong to tokens the
   task never produces, so their noise cannot affect the reward.
5. The pure-noise expectation of the top-r energy is estimated by Monte Carlo on Gaussian
   matrices of the same shape (`energy_noise`); the permutation null gives the same quantity up
   to sampling, because a fixed combination of iid Gaussian noise tensors is an iid Gaussian
   matrix.

Efficiency (the point of the design): per matrix, every specialist's noise is generated ONCE and
stacked, E (N x m*n, rows sigma_i eps_i); every split's and every permutation's aggregates are
rows of one coefficient matrix C, so all of them come from GEMMs C @ E. With N even the halves
cover the population, so G_B = G_all - G_A (one GEMM row per split instead of two). When E does
not fit the memory budget (--memory-mb) the noise is streamed instead: for a chunk of
coefficient rows, each specialist's tensor is regenerated and accumulated (then a specialist's
noise is drawn once per chunk, counted in `noise_draws`). Top-r subspaces come from
`torch.svd_lowrank` (q = max rank + 8, 2 power iterations), or are exact (eigendecomposition of
the Gram matrix) when a matrix side is <= 160; the observed statistic and its null use the same estimator, so approximation error does not
bias the test. Memory: E, one chunk of aggregates and their factors, never N models.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from corp import CorpError
from corp.perturb import ParamFilter, noise
from corp.runs import atomic_write_text, read_json, read_jsonl, write_json

OVERSAMPLE = 8
EXACT_MAX = 160  # exact SVD (via the Gram matrix) when a matrix side is at most this
STATS = ("overlap_left", "overlap_right", "overlap", "marginal", "cos_raw", "cos_proj", "energy")


# ----------------------------------------------------------------------------- small helpers


def zscore(rewards: Sequence[float]) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    sd = r.std()
    if not np.isfinite(sd) or sd < 1e-12:
        raise CorpError(f"all {len(r)} rewards are equal ({r[0] if len(r) else 'none'}); there is no signal to analyse")
    return (r - r.mean()) / sd


def subspace_overlap(U_A: torch.Tensor, U_B: torch.Tensor, r: int) -> float:
    """o_r = ||U_A[:, :r]^T U_B[:, :r]||_F^2 / r (1 = same subspace, r/m on average for random ones)."""
    M = U_A[:, :r].T @ U_B[:, :r]
    return float((M**2).sum() / r)


def project_low_rank(update: torch.Tensor, r: int) -> torch.Tensor:
    """Best rank-r approximation of a 2-D update (Eckart-Young, exact SVD), same dtype and shape."""
    B, A = low_rank_factors(update, r)
    return (B @ A).to(update.dtype)


def low_rank_factors(update: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) with B @ A the best rank-r approximation of `update` (m x n): B = U_r S_r (m x r), A = V_r^T (r x n).

    This is the LoRA parametrisation (delta = B @ A); r = 0 gives empty factors (a zero update)."""
    if update.dim() != 2:
        raise CorpError(f"low-rank projection needs a 2-D matrix, got shape {tuple(update.shape)}")
    if r < 0:
        raise CorpError(f"rank must be >= 0, got {r}")
    m, n = update.shape
    x = update.detach().to(torch.float32)
    r = min(r, m, n)
    if r == 0:
        return x.new_zeros(m, 0), x.new_zeros(0, n)
    U, S, Vh = torch.linalg.svd(x, full_matrices=False)
    return U[:, :r] * S[:r], Vh[:r].contiguous()


def reproducible_ranks(run_dir: str | Path) -> dict[str, int]:
    """{parameter name: r*} from a run's analyze-rank output (rank_summary.json, else rank_analysis.csv)."""
    run_dir = Path(run_dir)
    summary = run_dir / "rank_summary.json"
    if summary.exists():
        data = read_json(summary)
        if not isinstance(data.get("r_star"), dict):
            raise CorpError(f"'{summary}' has no r_star table; rerun corp analyze-rank")
        return {k: int(v) for k, v in data["r_star"].items()}
    table = run_dir / "rank_analysis.csv"
    if table.exists():
        with open(table, newline="") as fh:
            return {row["matrix"]: int(row["r_star"]) for row in csv.DictReader(fh)}
    raise CorpError(f"'{run_dir}' has no rank_summary.json or rank_analysis.csv; run `corp analyze-rank --run {run_dir}` first")


def layer_and_module(name: str) -> tuple[int | None, str]:
    m = re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", name)
    parts = [p for p in name.split(".") if p not in ("weight", "bias")]
    return (int(m.group(1)) if m else None), (parts[-1] if parts else name)


# ----------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    """Splits and permutations, shared by every matrix. Group 0 is the observed rewards, groups
    1..P are permutations; every group uses the same S splits."""

    weights: np.ndarray  # (N,) z-scored rewards
    splits: list[tuple[np.ndarray, np.ndarray]]  # (A indices, B indices)
    perms: list[np.ndarray]  # (1 + P) permutations, the first is the identity

    @classmethod
    def make(cls, rewards: Sequence[float], n_splits: int, n_perms: int, seed: int) -> "Plan":
        w = zscore(rewards)
        n = len(w)
        if n < 4:
            raise CorpError(f"the split-half analysis needs at least 4 specialists, got {n}")
        rng = np.random.default_rng(seed)
        half = n // 2
        splits = []
        for _ in range(n_splits):
            p = rng.permutation(n)
            splits.append((np.sort(p[:half]), np.sort(p[half : 2 * half])))
        perms = [np.arange(n)] + [rng.permutation(n) for _ in range(n_perms)]
        return cls(w, splits, perms)

    @property
    def n(self) -> int:
        return len(self.weights)

    @property
    def covers_all(self) -> bool:
        return self.n % 2 == 0

    def group_rows(self, g: int) -> torch.Tensor:
        """Coefficient rows of group g: [all] + [A_s for s] (+ [B_s for s] when N is odd)."""
        wg = self.weights[self.perms[g]]
        rows = [wg]
        for a, _ in self.splits:
            row = np.zeros(self.n)
            row[a] = wg[a]
            rows.append(row)
        if not self.covers_all:
            for _, b in self.splits:
                row = np.zeros(self.n)
                row[b] = wg[b]
                rows.append(row)
        return torch.tensor(np.stack(rows), dtype=torch.float32)


# ----------------------------------------------------------------------------- noise and SVD


class NoiseStack:
    """One matrix's noise for the whole population, generated once (or streamed when too big)."""

    def __init__(self, name: str, shape: tuple[int, int], seeds: Sequence[int], sigmas: Sequence[float], budget_bytes: int):
        self.name, self.shape = name, tuple(shape)
        self.seeds, self.sigmas = list(seeds), [float(s) for s in sigmas]
        self.numel = self.shape[0] * self.shape[1]
        self.gen = torch.Generator(device="cpu")
        self.draws = 0
        self.E: torch.Tensor | None = None
        if len(self.seeds) * self.numel * 4 <= budget_bytes:
            self.E = torch.empty(len(self.seeds), self.numel, dtype=torch.float32)
            for i, (s, sg) in enumerate(zip(self.seeds, self.sigmas)):
                noise(s, name, self.shape, self.gen, out=self.E[i].view(self.shape)).mul_(sg)
                self.draws += 1

    @property
    def stacked(self) -> bool:
        return self.E is not None

    def combine(self, C: torch.Tensor) -> torch.Tensor:
        """(k x N) coefficients -> (k, m, n) aggregates sum_i C[:, i] sigma_i eps_i."""
        if self.E is not None:
            return (C @ self.E).view(-1, *self.shape)
        out = torch.zeros(C.shape[0], self.numel, dtype=torch.float32)
        buf = torch.empty(self.numel, dtype=torch.float32)
        for i, (s, sg) in enumerate(zip(self.seeds, self.sigmas)):
            noise(s, self.name, self.shape, self.gen, out=buf.view(self.shape))
            self.draws += 1
            out.addr_(C[:, i], buf, alpha=sg)
        return out.view(-1, *self.shape)


def top_svd(G: torch.Tensor, q: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-q singular triplets of a batch (k, m, n): U (k, m, q), S (k, q), V (k, n, q).

    Small matrices (a side <= EXACT_MAX): exact, from the eigendecomposition of the Gram matrix of
    the short side (batched eigh is much faster than batched SVD on CPU, and a Gaussian-like
    matrix is well conditioned). Bigger ones: torch.svd_lowrank one matrix at a time."""
    m, n = G.shape[-2:]
    q = min(q, m, n)
    if min(m, n) <= EXACT_MAX:
        with one_thread():  # batched small LAPACK calls: 2 threads were ~15x slower than 1 here (spin-waits)
            return _gram_svd(G, q)
    outs = [torch.svd_lowrank(g, q=q, niter=2) for g in G]  # a loop is faster than a batch on CPU
    return tuple(torch.stack([o[j] for o in outs]) for j in range(3))  # type: ignore[return-value]


@contextmanager
def one_thread(threads: int = 1):
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _gram_svd(G: torch.Tensor, q: int):
    m, n = G.shape[-2:]
    Gd = G.double()
    if m >= n:
        w, V = torch.linalg.eigh(Gd.transpose(-1, -2) @ Gd)
        V = V.flip(-1)[..., :q]
        S = w.flip(-1)[..., :q].clamp_min(0).sqrt()
        U = (Gd @ V) / S.clamp_min(1e-30)[..., None, :]
    else:
        w, U = torch.linalg.eigh(Gd @ Gd.transpose(-1, -2))
        U = U.flip(-1)[..., :q]
        S = w.flip(-1)[..., :q].clamp_min(0).sqrt()
        V = (Gd.transpose(-1, -2) @ U) / S.clamp_min(1e-30)[..., None, :]
    return U.float(), S.float(), V.float()


def pair_stats(GA, GB, UA, SA, VA, UB, SB, VB, ranks: Sequence[int]) -> dict[str, torch.Tensor]:
    """Statistics of k split pairs at each rank; every output is (k, len(ranks)).

    Overlaps are returned as counts ||U_A[:, :r]^T U_B[:, :r]||_F^2 (normalised later)."""
    fA = (GA * GA).sum((-1, -2)).double()
    fB = (GB * GB).sum((-1, -2)).double()
    cos_raw = (GA * GB).sum((-1, -2)).double() / torch.sqrt(fA * fB).clamp_min(1e-300)
    MU = UA.transpose(-1, -2) @ UB
    MV = VA.transpose(-1, -2) @ VB
    tA = (UA * (GB @ VA)).sum(-2).double()  # u_Aj^T G_B v_Aj
    tB = (UB * (GA @ VB)).sum(-2).double()
    SA2, SB2 = SA.double() ** 2, SB.double() ** 2
    cA, cB = torch.cumsum(SA.double() * tA, -1), torch.cumsum(SB.double() * tB, -1)
    eA, eB = torch.cumsum(SA2, -1), torch.cumsum(SB2, -1)
    out: dict[str, list] = {k: [] for k in ("cnt_left", "cnt_right", "cos_raw", "cos_proj", "energy")}
    for r in ranks:
        out["cnt_left"].append((MU[:, :r, :r] ** 2).sum((-1, -2)).double())
        out["cnt_right"].append((MV[:, :r, :r] ** 2).sum((-1, -2)).double())
        out["cos_raw"].append(cos_raw)
        cos_ab = cA[:, r - 1] / torch.sqrt(eA[:, r - 1] * fB).clamp_min(1e-300)
        cos_ba = cB[:, r - 1] / torch.sqrt(eB[:, r - 1] * fA).clamp_min(1e-300)
        out["cos_proj"].append((cos_ab + cos_ba) / 2)
        out["energy"].append((eA[:, r - 1] / fA + eB[:, r - 1] / fB) / 2)
    return {k: torch.stack(v, -1) for k, v in out.items()}


_NOISE_ENERGY: dict[tuple, np.ndarray] = {}


def noise_energy(shape: tuple[int, int], ranks: Sequence[int], q: int, draws: int = 3) -> np.ndarray:
    """Pure-noise expectation of the top-r energy fraction for an iid Gaussian matrix (Monte Carlo)."""
    key = (tuple(shape), tuple(ranks), q)
    if key not in _NOISE_ENERGY:
        gen = torch.Generator().manual_seed(12345)
        G = torch.randn(draws, *shape, generator=gen)
        _, S, _ = top_svd(G, q)
        e = torch.cumsum(S.double() ** 2, -1) / (G.double() ** 2).sum((-1, -2))[:, None]
        _NOISE_ENERGY[key] = e[:, [r - 1 for r in ranks]].mean(0).numpy()
    return _NOISE_ENERGY[key]


# ----------------------------------------------------------------------------- one matrix


def analyze_matrix(name: str, shape: tuple[int, int], seeds, sigmas, plan: Plan, ranks: Sequence[int], alpha: float = 0.05, budget_bytes: int = 1 << 30) -> dict:
    """All statistics of one weight matrix; returns {"rows": [one dict per rank], "r_star", ...}."""
    m, n = shape
    ranks = [r for r in ranks if r <= min(m, n)]
    if not ranks:
        raise CorpError(f"matrix {name} {tuple(shape)} is smaller than every requested rank")
    q = min(max(ranks) + OVERSAMPLE, m, n)
    stack = NoiseStack(name, shape, seeds, sigmas, budget_bytes)
    S = len(plan.splits)
    per_group = S + 1 if plan.covers_all else 2 * S + 1
    n_groups = len(plan.perms)
    chunk = max(1, budget_bytes // (per_group * m * n * 4))  # groups of aggregates held at once
    acc = {k: np.zeros((n_groups, len(ranks))) for k in ("cnt_left", "cnt_right", "cos_raw", "cos_proj", "energy")}
    for g0 in range(0, n_groups, chunk):
        groups = list(range(g0, min(n_groups, g0 + chunk)))
        C = torch.cat([plan.group_rows(g) for g in groups])
        G = stack.combine(C).view(len(groups), per_group, m, n)
        GA = G[:, 1 : S + 1]
        GB = G[:, S + 1 :] if not plan.covers_all else G[:, :1] - GA
        GA, GB = GA.reshape(-1, m, n), GB.reshape(-1, m, n)
        UA, SA, VA = top_svd(GA, q)
        UB, SB, VB = top_svd(GB, q)
        st = pair_stats(GA, GB, UA, SA, VA, UB, SB, VB, ranks)
        for k, v in st.items():
            acc[k][groups] = v.view(len(groups), S, len(ranks)).mean(1).numpy()
        del G, GA, GB
    r_arr = np.asarray(ranks, dtype=np.float64)
    prev = np.concatenate([[0.0], r_arr[:-1]])
    cnt = (acc["cnt_left"] + acc["cnt_right"]) / 2
    prev_cnt = np.concatenate([np.zeros((n_groups, 1)), cnt[:, :-1]], axis=1)
    values = {
        "overlap_left": acc["cnt_left"] / r_arr,
        "overlap_right": acc["cnt_right"] / r_arr,
        "overlap": cnt / r_arr,
        "marginal": (cnt - prev_cnt) / (r_arr - prev),
        "cos_raw": acc["cos_raw"],
        "cos_proj": acc["cos_proj"],
        "energy": acc["energy"],
    }
    P = n_groups - 1
    summary = {}
    for k, v in values.items():
        obs, null = v[0], v[1:]
        summary[k] = (obs, null.mean(0), np.percentile(null, 95, axis=0), (1 + (null >= obs - 1e-12).sum(0)) / (P + 1))
    passes = summary["marginal"][3] <= alpha
    r_star = 0
    for r, ok in zip(ranks, passes):
        if not ok:
            break
        r_star = r
    cum_pass = [r for r, p in zip(ranks, summary["overlap"][3]) if p <= alpha]
    r_star_cum = max(cum_pass) if cum_pass else 0
    e_noise = noise_energy(shape, ranks, q)
    layer, module = layer_and_module(name)
    rows = []
    for j, r in enumerate(ranks):
        row = {"matrix": name, "layer": "" if layer is None else layer, "module": module, "m": m, "n": n, "rank": r}
        for k in STATS:
            obs, mean, p95, p = summary[k]
            row[k] = float(obs[j])
            row[f"{k}_null_mean"] = float(mean[j])
            row[f"{k}_null_p95"] = float(p95[j])
            row[f"{k}_p"] = float(p[j])
        row["overlap_random"] = (r / m + r / n) / 2
        row["energy_noise"] = float(e_noise[j])
        row["reproducible"] = bool(passes[j])
        row["r_star"] = r_star
        row["r_star_cumulative"] = r_star_cum
        rows.append(row)
    return {"matrix": name, "layer": layer, "module": module, "shape": [m, n], "r_star": r_star, "r_star_cumulative": r_star_cum, "rows": rows, "noise_draws": stack.draws, "stacked": stack.stacked}


# ----------------------------------------------------------------------------- the population


def analysis_targets(named_shapes: Sequence[tuple[str, tuple[int, ...]]], vocab_size: int | None, include_embeddings: bool, matrices: str = ".*") -> tuple[list[tuple[str, tuple[int, int]]], list[str]]:
    """2-D parameters to analyse (1-D norms and biases skipped), and the names skipped on purpose."""
    try:
        pattern = re.compile(matrices)
    except re.error as exc:
        raise CorpError(f"--matrices '{matrices}' is not a valid regex: {exc}") from None
    keep, skipped = [], []
    for name, shape in named_shapes:
        if len(shape) != 2 or not pattern.search(name):
            continue
        if not include_embeddings and vocab_size and vocab_size in tuple(shape):
            skipped.append(name)
            continue
        keep.append((name, (int(shape[0]), int(shape[1]))))
    if not keep:
        raise CorpError(f"no weight matrix to analyse (--matrices '{matrices}', embeddings {'included' if include_embeddings else 'excluded'})")
    return keep, skipped


def analyze_population(named_shapes, seeds, sigmas, rewards, ranks=(1, 2, 4, 8, 16, 32), splits: int = 10, permutations: int = 20, alpha: float = 0.05, seed: int = 0, budget_bytes: int = 1 << 30, vocab_size: int | None = None, include_embeddings: bool = False, matrices: str = ".*", progress: bool = True, threads: int | None = 1) -> dict:
    """Analyse every 2-D matrix; returns {"matrices": [per-matrix results], "plan": Plan, "skipped": [...], "seconds"}."""
    if not (len(seeds) == len(sigmas) == len(rewards)):
        raise CorpError("seeds, sigmas and rewards must have the same length")
    targets, skipped = analysis_targets(named_shapes, vocab_size, include_embeddings, matrices)
    plan = Plan.make(rewards, splits, permutations, seed)
    t0 = time.perf_counter()
    results = []
    # One thread by default: on a shared 2-core machine, svd_lowrank's QR and batched eigh ran
    # 15-100x slower with 2 threads than with 1 (spin-waiting threads); --threads overrides.
    with torch.random.fork_rng(devices=[]), one_thread(threads or torch.get_num_threads()):  # svd_lowrank draws from the global RNG: seed it, leave the caller's untouched
        torch.manual_seed(seed)
        bar = tqdm(targets, desc="analyze-rank", unit="matrix", dynamic_ncols=True, disable=not progress or os.environ.get("CORP_NO_PROGRESS") == "1")
        for name, shape in bar:
            bar.set_postfix_str(name[-32:])
            results.append(analyze_matrix(name, shape, seeds, sigmas, plan, ranks, alpha, budget_bytes))
        bar.close()
    return {"matrices": results, "plan": plan, "skipped": skipped, "seconds": time.perf_counter() - t0}


# ----------------------------------------------------------------------------- outputs


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return float(sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1)))


def summarise(result: dict, meta: dict, ranks: Sequence[int], alpha: float) -> dict:
    mats = result["matrices"]
    n_mat = len(mats)
    with_rank = [m for m in mats if m["r_star"] > 0]
    hist: dict[str, int] = {}
    for m in mats:
        hist[str(m["r_star"])] = hist.get(str(m["r_star"]), 0) + 1

    def group(key):
        out: dict[str, dict] = {}
        for m in mats:
            k = "none" if m[key] is None else str(m[key])
            d = out.setdefault(k, {"n": 0, "with_rank": 0, "sum": 0})
            d["n"] += 1
            d["with_rank"] += m["r_star"] > 0
            d["sum"] += m["r_star"]
        return {k: {"n": d["n"], "fraction_with_rank": d["with_rank"] / d["n"], "mean_r_star": d["sum"] / d["n"]} for k, d in out.items()}

    def first_rank(stat):
        vals = [(m["rows"][0][stat], m["rows"][0][f"{stat}_null_mean"], m["rows"][0][f"{stat}_p"]) for m in mats]
        return {
            "rank": mats[0]["rows"][0]["rank"],
            "mean": float(np.mean([v[0] for v in vals])),
            "null_mean": float(np.mean([v[1] for v in vals])),
            "fraction_p_le_alpha": float(np.mean([v[2] <= alpha for v in vals])),
        }

    plan: Plan = result["plan"]
    return {
        **meta,
        "n_specialists": plan.n,
        "half_size": plan.n // 2,
        "weights": "z-scored rewards",
        "splits": len(plan.splits),
        "permutations": len(plan.perms) - 1,
        "alpha": alpha,
        "ranks": list(ranks),
        "rule": "r* = largest grid rank r such that the marginal overlap beats its permutation null (p <= alpha) at r and at every smaller grid rank; 0 if it fails at the first rank",
        "n_matrices": n_mat,
        "skipped_matrices": result["skipped"],
        "n_with_rank": len(with_rank),
        "fraction_with_rank": len(with_rank) / n_mat,
        "expected_fraction_under_null": alpha,
        "binomial_p_vs_null": _binom_sf(len(with_rank), n_mat, alpha),
        "r_star_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "r_star_cumulative_hist": {str(r): sum(m["r_star_cumulative"] == r for m in mats) for r in sorted({m["r_star_cumulative"] for m in mats})},
        "by_module": group("module"),
        "by_layer": group("layer"),
        "whole_model": {"overlap": first_rank("overlap"), "cos_raw": first_rank("cos_raw"), "cos_proj": first_rank("cos_proj"), "energy": first_rank("energy")},
        "noise_draws": sum(m["noise_draws"] for m in mats),
        "streamed_matrices": [m["matrix"] for m in mats if not m["stacked"]],
        "seconds": result["seconds"],
        "r_star": {m["matrix"]: m["r_star"] for m in mats},
    }


def summary_text(s: dict) -> str:
    lines = [
        f"analyze-rank: {s['n_matrices']} weight matrices, N = {s['n_specialists']} specialists (halves of {s['half_size']}), "
        f"S = {s['splits']} splits, P = {s['permutations']} permutations, alpha = {s['alpha']}, {s['seconds']:.0f} s",
        f"matrices with a reproducible rank r* > 0: {s['n_with_rank']}/{s['n_matrices']} ({100 * s['fraction_with_rank']:.1f}%; "
        f"~{100 * s['alpha']:.0f}% expected by chance, binomial p = {s['binomial_p_vs_null']:.3g})",
        "r* histogram: " + ", ".join(f"r*={k}: {v}" for k, v in s["r_star_hist"].items()),
    ]
    wm = s["whole_model"]
    for stat in ("overlap", "cos_raw", "energy"):
        d = wm[stat]
        lines.append(f"  mean {stat} at r={d['rank']}: {d['mean']:.4f} (null {d['null_mean']:.4f}); p <= alpha in {100 * d['fraction_p_le_alpha']:.0f}% of matrices")
    lines.append("by module: " + ", ".join(f"{k} {v['fraction_with_rank'] * v['n']:.0f}/{v['n']}" for k, v in s["by_module"].items()))
    if s["n_with_rank"] == 0:
        lines.append("no reproducible low-rank structure: no matrix's split-half overlap beats the permutation null")
    elif s["binomial_p_vs_null"] > 0.05:
        lines.append("the matrices with r* > 0 are no more than chance predicts at this level: treat them as noise")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    atomic_write_text(path, buf.getvalue())


def _savefig(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)


def plot_overlap(path: Path, mats: list[dict], k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = sorted(mats, key=lambda m: -m["r_star"])[: max(1, k // 2)]
    rest = [m for m in mats if m not in chosen]
    step = max(1, len(rest) // max(1, k - len(chosen)))
    chosen += rest[::step][: k - len(chosen)]
    fig, axes = plt.subplots(2, len(chosen), figsize=(3.6 * len(chosen), 6), squeeze=False)
    for j, m in enumerate(chosen):
        rs = [row["rank"] for row in m["rows"]]
        for i, (stat, label) in enumerate((("overlap", "overlap o_r"), ("marginal", "marginal overlap"))):
            ax = axes[i, j]
            obs = [row[stat] for row in m["rows"]]
            mean = [row[f"{stat}_null_mean"] for row in m["rows"]]
            p95 = [row[f"{stat}_null_p95"] for row in m["rows"]]
            ax.fill_between(rs, [0] * len(rs), p95, color="0.85", label="null (0 .. 95th pct)")
            ax.plot(rs, mean, color="0.5", ls="--", label="null mean")
            ax.plot(rs, obs, "o-", color="C0" if m["r_star"] == 0 else "C3", label="observed")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("rank r")
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"{m['matrix'].replace('model.', '').replace('.weight', '')}\n{m['shape'][0]}x{m['shape'][1]}, r*={m['r_star']}", fontsize=8)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def plot_heatmap(path: Path, mats: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layered = [m for m in mats if m["layer"] is not None]
    if not layered:
        return
    layers = sorted({m["layer"] for m in layered})
    modules = list(dict.fromkeys(m["module"] for m in layered))
    grid = np.full((len(layers), len(modules)), np.nan)
    for m in layered:
        grid[layers.index(m["layer"]), modules.index(m["module"])] = m["r_star"]
    fig, ax = plt.subplots(figsize=(1.1 * len(modules) + 2, 0.25 * len(layers) + 1.6))
    vmax = max(1.0, float(np.nanmax(grid)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
    ax.set_xticks(range(len(modules)), modules, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(layers)), [str(x) for x in layers], fontsize=6 if len(layers) > 16 else 8)
    ax.set_ylabel("layer")
    ax.set_title("reproducible rank r* (0 = none)", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def write_outputs(out_dir: Path, result: dict, summary: dict, plot_matrices: int = 4) -> None:
    mats = result["matrices"]
    write_csv(out_dir / "rank_analysis.csv", [row for m in mats for row in m["rows"]])
    write_json(out_dir / "rank_summary.json", summary)
    plot_overlap(out_dir / "rank_overlap.png", mats, plot_matrices)
    plot_heatmap(out_dir / "rank_heatmap.png", mats)


# ----------------------------------------------------------------------------- the command


def model_shapes(model_name: str) -> tuple[str, list[tuple[str, tuple[int, ...]]], int | None]:
    """(model id, [(canonical name, shape)], vocab size) without loading weights (meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from corp.models import resolve_model

    model_id, path = resolve_model(model_name)
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    named = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    return model_id, named, vocab


def load_run_population(run_dir: Path) -> tuple[list[dict], dict, dict]:
    import yaml

    rows = [r for r in read_jsonl(run_dir / "population.jsonl", key="key", repair=False) if r.get("split", "support") == "support" and r.get("seed") is not None]
    rows = list({r["key"]: r for r in rows}.values())
    if not rows:
        raise CorpError(f"'{run_dir}/population.jsonl' has no scored specialists")
    meta_path = run_dir / "population_meta.json"
    meta = read_json(meta_path) if meta_path.exists() else {}
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise CorpError(f"'{run_dir}' has no config.yaml, so its model is unknown")
    run_cfg = yaml.safe_load(cfg_path.read_text()) or {}
    return rows, meta, run_cfg


def run_analyze_rank(cfg) -> dict:
    """`corp analyze-rank`: analyse a scored population and write the outputs into its run directory."""
    if cfg.run:
        run_dir = Path(cfg.run)
        rows, meta, run_cfg = load_run_population(run_dir)
        model_name = run_cfg.get("model") or meta.get("model")
        pf = meta.get("param_filter") or {"include": run_cfg.get("include", ".*"), "exclude": run_cfg.get("exclude", "")}
    else:
        from corp.evaluate.scorer import ensure_population, setup_run

        ctx = setup_run(cfg, "analyze-rank", needs=("support",))
        rows = ensure_population(ctx)
        ctx._backend = None  # free the model: the analysis needs shapes only
        run_dir = ctx.run_dir
        model_name = cfg.model
        pf = {"include": cfg.include, "exclude": cfg.exclude}
        meta = {}
    model_id, named, vocab = model_shapes(model_name)
    if meta.get("model") and meta["model"] != model_id:
        raise CorpError(f"population in '{run_dir}' was scored on {meta['model']} but its config names {model_name} ({model_id})")
    pfilter = ParamFilter(pf.get("include", ".*"), pf.get("exclude", ""))

    named = [(n, s) for n, s in named if pfilter(n)]  # the perturbed parameters (tied weights appear once)
    if not named:
        raise CorpError(f"parameter filter (include '{pfilter.include}', exclude '{pfilter.exclude}') selects no parameter of {model_id}")
    sigmas_seen = sorted({float(r["sigma"]) for r in rows})
    if len(rows) < 16:
        warnings.warn(f"only {len(rows)} specialists: halves of {len(rows) // 2} have very little power")
    result = analyze_population(
        named, [int(r["seed"]) for r in rows], [float(r["sigma"]) for r in rows], [float(r["reward"]) for r in rows],
        ranks=cfg.ranks, splits=cfg.splits, permutations=cfg.permutations, alpha=cfg.alpha, seed=cfg.analysis_seed,
        budget_bytes=cfg.memory_mb << 20, vocab_size=vocab, include_embeddings=cfg.include_embeddings, matrices=cfg.matrices, threads=cfg.threads or 1,
    )
    summary = summarise(result, {"run_dir": str(run_dir), "model": model_id, "param_filter": pf, "sigmas": sigmas_seen, "analysis_seed": cfg.analysis_seed, "matrices_regex": cfg.matrices}, cfg.ranks, cfg.alpha)
    write_outputs(run_dir, result, summary, cfg.plot_matrices)
    summary["text"] = summary_text(summary)
    return summary
