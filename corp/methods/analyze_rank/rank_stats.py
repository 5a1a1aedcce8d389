"""Split-half low-rank analysis: the statistics (`corp analyze-rank`; reports in `report`, the
command in `split_half`, the power simulation in `power`).

What it implements: for every weight matrix W (m x n) and rank r, do two random halves A, B of
the population, aggregated as G_A = sum_{i in A} w_i sigma_i eps_i[W] with z-scored rewards w,
share their top-r singular subspaces more than they would if rewards carried no information?
From that, a reproducible rank r* per matrix, which low-rank consolidation (docs/methods.md, "Low-rank
consolidation") uses to project the merged update.

This is OUR specification. The CoRP paper (arXiv 2605.31494) reports "reproducible low-rank
structure in every case" but publishes no code for it; we implement docs/methods.md, "Split-half
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
   prefix rule keeps the per-matrix false-positive rate at the level of one test (the
   significance level), not one per rank (tests/test_split_half.py measures it on 800 null
   matrices). The literal cumulative rule is still reported (`r_star_cumulative`). Near the
   detection threshold r* can still overshoot a planted rank k by a grid step or two: the partly
   recovered signal leaks into the next singular directions of both halves, which then overlap
   more than the null's.
2. "Beats the null" means the empirical permutation p-value (1 + #{null >= obs}) / (P + 1) is
   <= the significance level (0.05). With P = 20 this requires the observed value to exceed
   every null value (a false-positive rate of 1/21 = 4.8%); the interpolated 95th percentile of
   20 null draws is the 19th-20th order statistic, which a null statistic exceeds about 2 times
   in 21 (9.5%, not 5%). The null's mean and 95th percentile are reported as asked.
3. Weights are z-scored rewards only (the stage-1 weights w2 of CoRP are not offered: they depend
   on consolidation settings that do not exist at analysis time).
4. Vocabulary matrices (a dimension equal to the vocabulary size: embed_tokens, lm_head) are
   skipped unless --include-embeddings: for SmolLM2 that one 49152 x 576 matrix holds 21% of the
   weights and its stacked noise would be N x 113 MB, and most of its rows belong to tokens the
   task never produces, so their noise cannot affect the reward.
5. The pure-noise expectation of the top-r energy is estimated by Monte Carlo on Gaussian
   matrices of the same shape (`noise_energy`); the permutation null gives the same quantity up
   to sampling, because a fixed combination of iid Gaussian noise tensors is an iid Gaussian
   matrix.
6. Added (not in docs/methods.md): the power of the rule at the population size and matrix shapes of
   the run (`corp.methods.analyze_rank.power`), because "no reproducible structure" means little without it.

Efficiency (the point of the design): per matrix, every specialist's noise is generated ONCE and
stacked, E (N x m*n, rows sigma_i eps_i); every split's and every permutation's aggregates are
rows of one coefficient matrix C, so all of them come from GEMMs C @ E. With N even the halves
cover the population, so G_B = G_all - G_A (one GEMM row per split instead of two). When E does
not fit the memory budget (--memory-mb) the noise is streamed instead: for a chunk of
coefficient rows, each specialist's tensor is regenerated and accumulated (then a specialist's
noise is drawn once per chunk, counted in `noise_draws`). Top-r subspaces come from
`torch.svd_lowrank` (q = max rank + 8, 2 power iterations), or are exact (eigendecomposition of
the Gram matrix) when a matrix side is <= 160 (`corp.methods.analyze_rank.linalg.top_svd`); the observed
statistic and its null use the same estimator, so approximation error does not bias the test.
Memory: E, one chunk of aggregates and their factors, never N models.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from corp.algorithms.perturb import noise
from corp.algorithms.perturb.noise import SCHEME_VERSION
from corp.algorithms.stats import zscore
from corp.errors import CorpError
from corp.methods.analyze_rank.config import NAME
from corp.methods.analyze_rank.linalg import one_thread, top_svd
from corp.runtime.ledger import say_expected
from corp.runtime.progress import progress_disabled

OVERSAMPLE = 8
STATS = ("overlap_left", "overlap_right", "overlap", "marginal", "cos_raw", "cos_proj", "energy")
COUNTS = ("cnt_left", "cnt_right", "cos_raw", "cos_proj", "energy")
TIE = 1e-12  # a null value within this of the observed one counts as reaching it (ties never pass)


def reward_weights(rewards: Sequence[float]) -> np.ndarray:
    """z-scored rewards; all-equal rewards carry no signal, which is an error here, not zeros."""
    r = np.asarray(rewards, dtype=np.float64)
    w = zscore(r)
    if len(r) and not np.any(w):
        raise CorpError(f"all {len(r)} rewards are equal ({r[0]}); there is no signal to analyse")
    return w


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
    def make(cls, rewards: Sequence[float], n_splits: int, n_perms: int, seed: int) -> Plan:
        n = len(rewards)
        if n < 4:
            raise CorpError(f"the split-half analysis needs at least 4 specialists, got {n}")
        w = reward_weights(rewards)
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

    @property
    def per_group(self) -> int:
        """Aggregates per group: all + S halves A (+ S halves B when N is odd)."""
        return len(self.splits) + 1 if self.covers_all else 2 * len(self.splits) + 1

    def group_rows(self, g: int) -> torch.Tensor:
        """Coefficient rows of group g: [all] + [A_s for s] (+ [B_s for s] when N is odd)."""
        cache = self.__dict__.setdefault("_rows", {})  # the same for every matrix: build once
        if g not in cache:
            cache[g] = self._group_rows(g)
        return cache[g]

    def _group_rows(self, g: int) -> torch.Tensor:
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


# ----------------------------------------------------------------------------- noise


class NoiseStack:
    """One matrix's noise for the whole population, generated once (or streamed when too big)."""

    def __init__(
        self,
        name: str,
        shape: tuple[int, int],
        seeds: Sequence[int],
        sigmas: Sequence[float],
        budget_bytes: int,
        scheme: str = SCHEME_VERSION,
    ):
        self.name, self.shape, self.scheme = name, tuple(shape), scheme
        self.seeds, self.sigmas = list(seeds), [float(s) for s in sigmas]
        self.numel = self.shape[0] * self.shape[1]
        self.gen = torch.Generator(device="cpu")
        self.draws = 0
        self.E: torch.Tensor | None = None
        if len(self.seeds) * self.numel * 4 <= budget_bytes:
            self.E = torch.empty(len(self.seeds), self.numel, dtype=torch.float32)
            for i, (s, sg) in enumerate(zip(self.seeds, self.sigmas)):
                self._draw(s, self.E[i]).mul_(sg)

    def _draw(self, seed: int, out: torch.Tensor) -> torch.Tensor:
        self.draws += 1
        return noise(seed, self.name, self.shape, self.gen, out=out.view(self.shape), scheme=self.scheme)

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
            self._draw(s, buf)
            out.addr_(C[:, i], buf, alpha=sg)
        return out.view(-1, *self.shape)

    def entries(self, flat_index: Sequence[int]) -> torch.Tensor:
        """(N, k): sigma_i eps_i at the given flat positions (the power simulation's planted coordinates)."""
        idx = torch.as_tensor(list(flat_index), dtype=torch.long)
        if self.E is not None:
            return self.E[:, idx].clone()
        buf = torch.empty(self.numel, dtype=torch.float32)
        return torch.stack([self._draw(s, buf).view(-1)[idx] * sg for s, sg in zip(self.seeds, self.sigmas)])


# ----------------------------------------------------------------------------- statistics


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
    out: dict[str, list] = {k: [] for k in COUNTS}
    for r in ranks:
        out["cnt_left"].append((MU[:, :r, :r] ** 2).sum((-1, -2)).double())
        out["cnt_right"].append((MV[:, :r, :r] ** 2).sum((-1, -2)).double())
        out["cos_raw"].append(cos_raw)
        cos_ab = cA[:, r - 1] / torch.sqrt(eA[:, r - 1] * fB).clamp_min(1e-300)
        cos_ba = cB[:, r - 1] / torch.sqrt(eB[:, r - 1] * fA).clamp_min(1e-300)
        out["cos_proj"].append((cos_ab + cos_ba) / 2)
        out["energy"].append((eA[:, r - 1] / fA + eB[:, r - 1] / fB) / 2)
    return {k: torch.stack(v, -1) for k, v in out.items()}


def svd_rank(shape: tuple[int, int], ranks: Sequence[int]) -> int:
    """q: singular triplets computed per aggregate (the largest grid rank plus oversampling)."""
    return min(max(ranks) + OVERSAMPLE, *shape)


def group_counts(
    stack: NoiseStack, plan: Plan, groups: Sequence[int], ranks: Sequence[int], q: int
) -> dict[str, np.ndarray]:
    """Split-averaged statistics (COUNTS) of the given groups: each (len(groups), len(ranks)).

    The one computation behind both the analysis and its power simulation, so the two cannot
    drift apart."""
    m, n = stack.shape
    S = len(plan.splits)
    C = torch.cat([plan.group_rows(g) for g in groups])
    G = stack.combine(C).view(len(groups), plan.per_group, m, n)
    GA = G[:, 1 : S + 1]
    GB = G[:, S + 1 :] if not plan.covers_all else G[:, :1] - GA
    GA, GB = GA.reshape(-1, m, n), GB.reshape(-1, m, n)
    UA, SA, VA = top_svd(GA, q)
    UB, SB, VB = top_svd(GB, q)
    st = pair_stats(GA, GB, UA, SA, VA, UB, SB, VB, ranks)
    return {k: v.view(len(groups), S, len(ranks)).mean(1).numpy() for k, v in st.items()}


def overlap_values(acc: dict[str, np.ndarray], ranks: Sequence[int]) -> dict[str, np.ndarray]:
    """Normalised statistics (STATS) from split-averaged counts; rows are groups, columns ranks."""
    r_arr = np.asarray(ranks, dtype=np.float64)
    prev = np.concatenate([[0.0], r_arr[:-1]])
    cnt = (acc["cnt_left"] + acc["cnt_right"]) / 2
    prev_cnt = np.concatenate([np.zeros((cnt.shape[0], 1)), cnt[:, :-1]], axis=1)
    return {
        "overlap_left": acc["cnt_left"] / r_arr,
        "overlap_right": acc["cnt_right"] / r_arr,
        "overlap": cnt / r_arr,
        "marginal": (cnt - prev_cnt) / (r_arr - prev),
        "cos_raw": acc["cos_raw"],
        "cos_proj": acc["cos_proj"],
        "energy": acc["energy"],
    }


def permutation_p(obs: np.ndarray, null: np.ndarray) -> np.ndarray:
    """(1 + #{null >= obs}) / (P + 1), per column; null is (P, k)."""
    return (1 + (null >= obs - TIE).sum(0)) / (null.shape[0] + 1)


def max_exceedances(permutations: int, significance: float) -> int:
    """The most null values that may reach the observed one for p <= significance (-1: none can pass)."""
    return int(np.floor(significance * (permutations + 1) - 1 + 1e-9))


def r_star_rule(marginal_p: Sequence[float], ranks: Sequence[int], significance: float) -> int:
    """r* = the largest grid rank whose marginal test passes there and at every smaller grid rank; 0 if the first fails."""
    r_star = 0
    for r, p in zip(ranks, marginal_p):
        if not p <= significance:
            break
        r_star = r
    return r_star


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


def matrix_ranks(name: str, shape: tuple[int, int], ranks: Sequence[int]) -> list[int]:
    out = [r for r in ranks if r <= min(shape)]
    if not out:
        raise CorpError(f"matrix {name} {tuple(shape)} is smaller than every requested rank")
    return out


def analyze_matrix(
    name: str,
    shape: tuple[int, int],
    seeds,
    sigmas,
    plan: Plan,
    ranks: Sequence[int],
    significance: float = 0.05,
    budget_bytes: int = 1 << 30,
    scheme: str = SCHEME_VERSION,
) -> dict:
    """All statistics of one weight matrix; returns {"rows": [one dict per rank], "r_star", ...}."""
    m, n = shape
    ranks = matrix_ranks(name, shape, ranks)
    q = svd_rank(shape, ranks)
    stack = NoiseStack(name, shape, seeds, sigmas, budget_bytes, scheme)
    n_groups = len(plan.perms)
    chunk = max(1, budget_bytes // (plan.per_group * m * n * 4))  # groups of aggregates held at once
    acc = {k: np.zeros((n_groups, len(ranks))) for k in COUNTS}
    for g0 in range(0, n_groups, chunk):
        groups = list(range(g0, min(n_groups, g0 + chunk)))
        for k, v in group_counts(stack, plan, groups, ranks, q).items():
            acc[k][groups] = v
    values = overlap_values(acc, ranks)
    stacked = np.stack([values[k] for k in STATS])  # (stats, groups, ranks): one percentile call, not one per statistic
    obs, null = stacked[:, 0], stacked[:, 1:]
    p95 = np.percentile(null, 95, axis=1)
    summary = {k: (obs[i], null[i].mean(0), p95[i], permutation_p(obs[i], null[i])) for i, k in enumerate(STATS)}
    passes = summary["marginal"][3] <= significance
    r_star = r_star_rule(summary["marginal"][3], ranks, significance)
    cum_pass = [r for r, p in zip(ranks, summary["overlap"][3]) if p <= significance]
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
    return {
        "matrix": name,
        "layer": layer,
        "module": module,
        "shape": [m, n],
        "r_star": r_star,
        "r_star_cumulative": r_star_cum,
        "rows": rows,
        "noise_draws": stack.draws,
        "stacked": stack.stacked,
    }


# ----------------------------------------------------------------------------- the population


def analysis_targets(
    named_shapes: Sequence[tuple[str, tuple[int, ...]]],
    vocab_size: int | None,
    include_embeddings: bool,
    matrices: str = ".*",
) -> tuple[list[tuple[str, tuple[int, int]]], list[str]]:
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
        raise CorpError(
            f"no weight matrix to analyse (--matrices '{matrices}', embeddings "
            f"{'included' if include_embeddings else 'excluded'})"
        )
    return keep, skipped


# Seconds per weight of a matrix per split and round (1 + permutations): SmolLM2-135M's 21 matrices of
# layers 0, 15 and 29 (10.6M weights) took 321 s at S = 10, P = 20 on 2 shared cores
# (results/analyze-rank-cost/README.md); the SVDs of the half-aggregates dominate, so time grows with both.
SECONDS_PER_WEIGHT_ROUND = 321 / (10.6e6 * 10 * 21)


def _say_expected_time(targets, splits: int, permutations: int, first_seconds: float | None = None) -> None:
    """The analysis' expected time: before the first matrix, at the rate measured in
    results/analyze-rank-cost; after it, at the first matrix's own rate (per weight: shapes differ)."""
    weights = [int(np.prod(shape)) for _, shape in targets]
    if first_seconds is None:
        total = SECONDS_PER_WEIGHT_ROUND * sum(weights) * splits * (1 + permutations)
        basis = f"{splits} splits x {1 + permutations} rounds, at the rate measured in results/analyze-rank-cost"
        say_expected(NAME, len(targets), "matrices", total / max(1, len(targets)), basis=basis)
    elif len(targets) > 1:
        rest = first_seconds / weights[0] * sum(weights[1:])
        basis = f"at the rate of the first, which took {first_seconds:.3g} s"
        say_expected(NAME, len(targets) - 1, "matrices", rest / (len(targets) - 1), basis=basis)


def analyze_population(
    named_shapes,
    seeds,
    sigmas,
    rewards,
    ranks=(1, 2, 4, 8, 16, 32),
    splits: int = 10,
    permutations: int = 20,
    significance: float = 0.05,
    seed: int = 0,
    budget_bytes: int = 1 << 30,
    vocab_size: int | None = None,
    include_embeddings: bool = False,
    matrices: str = ".*",
    progress: bool = True,
    threads: int | None = 1,
    scheme: str = SCHEME_VERSION,
) -> dict:
    """Analyse every 2-D matrix; returns {"matrices": [per-matrix results], "plan": Plan, "skipped": [...], "seconds"}."""
    if not (len(seeds) == len(sigmas) == len(rewards)):
        raise CorpError("seeds, sigmas and rewards must have the same length")
    targets, skipped = analysis_targets(named_shapes, vocab_size, include_embeddings, matrices)
    plan = Plan.make(rewards, splits, permutations, seed)
    t0 = time.perf_counter()
    results = []
    # One thread by default: on a shared 2-core machine, svd_lowrank's QR and batched eigh ran
    # 15-100x slower with 2 threads than with 1 (spin-waiting threads); --threads overrides.
    with (
        torch.random.fork_rng(devices=[]),
        one_thread(threads or torch.get_num_threads()),
    ):  # svd_lowrank draws from the global RNG: seed it, leave the caller's untouched
        torch.manual_seed(seed)
        bar = tqdm(
            targets,
            desc=NAME,
            unit="matrix",
            dynamic_ncols=True,
            disable=not progress or progress_disabled(),
        )
        if progress:  # the bar's own estimate comes only as matrices finish: say it first
            _say_expected_time(targets, splits, permutations)
        for name, shape in bar:
            bar.set_postfix_str(name[-32:])
            results.append(analyze_matrix(name, shape, seeds, sigmas, plan, ranks, significance, budget_bytes, scheme))
            if progress and len(results) == 1:
                _say_expected_time(targets, splits, permutations, time.perf_counter() - t0)
        bar.close()
    return {"matrices": results, "plan": plan, "skipped": skipped, "seconds": time.perf_counter() - t0}
