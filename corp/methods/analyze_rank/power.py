"""Power of the split-half rule: the smallest planted signal `corp analyze-rank` finds with
probability 0.8 at the population size and matrix shapes it ran on.

Ours (docs/methods.md asks for the analysis, not its power; the CoRP paper, arXiv 2605.31494, reports
no power either). Without it, "no reproducible low-rank structure" cannot be told apart from "the
population is too small to see any": at N = 64, a 576 x 576 matrix and a reward that IS one
direction of that matrix, the rule still finds nothing.

The simulation, per matrix shape (each distinct shape of the analysed matrices, a transpose
counted as the same shape, at most `max_shapes`, the most frequent first):
1. N specialists with the run's sigmas get fresh corp noise eps_i (real seeds, the real noise
   function) of that shape.
2. A unit-norm rank-r direction D is planted: x_i = <D, sigma_i eps_i> is specialist i's move
   along D, and rewards are  reward_i = rho * x_i / sd(x) + sqrt(1 - rho^2) * e_i  with e_i
   standard normal. The strength is reported as rho^2, the SHARE OF REWARD VARIANCE explained by
   the planted direction (rho is the correlation between reward and projection). D uses
   coordinate directions, sum_k e_k e_k^T / sqrt(r): iid Gaussian noise is rotation invariant
   and every statistic of the analysis is rotation equivariant, so any D gives the same law.
3. The analysis's own decision is run on it (`rank_stats.group_counts`, the same splits S,
   permutations P, grid ranks, SVD estimator and significance level); "found" means r* >= 1, i.e.
   the first grid rank's marginal overlap beats its permutation null. That decision needs at
   most floor(significance (P + 1)) - 1 null values to reach the observed one, so each trial
   stops at the first null value over that count (same decision, a fraction of the cost
   when there is no signal).
4. Power at rho^2 = 1 first; if it is below the target, the answer is "not reached at this N".
   Otherwise a bisection on log(rho^2) (common random numbers: simulation j uses the same noise,
   reward noise, splits and permutations at every strength) down to a bracket ratio of 1.3;
   the reported share is the bracket's upper end, the smallest evaluated strength whose
   estimated power reached the target.

Next to it, the random-matrix (BBP) estimate of where a direction separates from the noise at
all: a half's aggregate carries the planted direction with singular value (N/2) rho s/sqrt(r)
over iid noise of sd sqrt(N/2) s (s^2 = mean sigma^2), and its top singular vectors carry
information about D only when sqrt(N/2) rho / sqrt(r) > (m n)^(1/4), i.e. rho^2 > 2 r sqrt(mn) / N.
80% power needs more than that edge; the simulation says how much.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from corp.algorithms.perturb.noise import SCHEME_VERSION
from corp.errors import CorpError
from corp.methods.analyze_rank.linalg import one_thread
from corp.methods.analyze_rank.rank_stats import (
    TIE,
    NoiseStack,
    Plan,
    group_counts,
    matrix_ranks,
    max_exceedances,
    overlap_values,
    svd_rank,
)

POWER_TARGET = 0.8
BRACKET_RATIO = 1.3
MAX_STEPS = 10


def shape_classes(shapes: Sequence[Sequence[int]], max_shapes: int = 4) -> tuple[list[dict], list[dict]]:
    """Distinct shapes (a transpose counts as the same), most frequent first: (kept, left out)."""
    counts: Counter = Counter()
    first: dict[tuple, tuple] = {}
    for s in shapes:
        key = tuple(sorted((int(s[0]), int(s[1]))))
        counts[key] += 1
        first.setdefault(key, (int(s[0]), int(s[1])))
    ordered = [
        {"shape": list(first[k]), "matrices": c}
        for k, c in sorted(counts.items(), key=lambda kv: (-kv[1], -kv[0][0] * kv[0][1]))
    ]
    return ordered[:max_shapes], ordered[max_shapes:]


def edge_share(shape: Sequence[int], n: int, planted_rank: int = 1) -> float:
    """Random-matrix estimate of the smallest share of reward variance a rank-r direction needs to
    show in a half's top singular vectors at all: 2 r sqrt(m n) / N (may exceed 1)."""
    return 2 * planted_rank * math.sqrt(shape[0] * shape[1]) / n


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson 95% interval of a binomial proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def simulated_population(
    shape: tuple[int, int],
    sigmas: Sequence[float],
    share: float,
    sim_seed: Sequence[int],
    planted_rank: int = 1,
    budget_bytes: int = 1 << 30,
    scheme: str = SCHEME_VERSION,
) -> tuple[NoiseStack, np.ndarray, int]:
    """(noise stack, rewards, plan seed) of one simulated population whose rewards carry a planted
    direction explaining `share` of their variance. The noise, reward noise and plan seed depend on
    `sim_seed` only, not on `share` (common random numbers across strengths)."""
    m, n = shape
    N = len(sigmas)
    rng = np.random.default_rng(list(sim_seed))
    seeds = [int(s) for s in rng.choice(1 << 40, size=N, replace=False)]
    e = rng.standard_normal(N)
    plan_seed = int(rng.integers(1 << 31))
    stack = NoiseStack(f"corp-power-sim/{m}x{n}", shape, seeds, sigmas, budget_bytes, scheme)
    r = min(planted_rank, m, n)
    x = stack.entries([k * n + k for k in range(r)]).double().sum(1).numpy() / math.sqrt(r)
    x /= math.sqrt(float(np.mean(np.square(sigmas))))  # population sd of x is sqrt(mean sigma^2)
    rewards = math.sqrt(share) * x + math.sqrt(max(0.0, 1 - share)) * e
    return stack, rewards, plan_seed


def detects(
    shape: tuple[int, int],
    sigmas: Sequence[float],
    share: float,
    sim_seed: Sequence[int],
    splits: int,
    permutations: int,
    ranks: Sequence[int],
    significance: float,
    planted_rank: int = 1,
    budget_bytes: int = 1 << 30,
    scheme: str = SCHEME_VERSION,
) -> bool:
    """One simulated population with a planted direction of the given share: does the rule find r* >= 1?"""
    m, n = shape
    ranks = matrix_ranks(f"{m}x{n}", shape, ranks)
    k_max = max_exceedances(permutations, significance)
    if k_max < 0:
        return False
    stack, rewards, plan_seed = simulated_population(shape, sigmas, share, sim_seed, planted_rank, budget_bytes, scheme)
    plan = Plan.make(rewards, splits, permutations, plan_seed)
    q = svd_rank(shape, ranks)
    first = [ranks[0]]
    chunk = 1 if stack.stacked else max(1, budget_bytes // (plan.per_group * m * n * 4))
    groups = list(range(len(plan.perms)))
    obs = None
    reached = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(plan_seed)  # svd_lowrank's test matrices
        for g0 in range(0, len(groups), chunk):
            acc = group_counts(stack, plan, groups[g0 : g0 + chunk], first, q)
            vals = overlap_values(acc, first)["marginal"][:, 0]
            if obs is None:
                obs, vals = vals[0], vals[1:]
            reached += int((vals >= obs - TIE).sum())
            if reached > k_max:
                return False
    return True


def shape_power(
    shape: Sequence[int],
    sigmas: Sequence[float],
    splits: int,
    permutations: int,
    ranks: Sequence[int],
    significance: float,
    sims: int,
    seed: int = 0,
    planted_rank: int = 1,
    target: float = POWER_TARGET,
    budget_bytes: int = 1 << 30,
    scheme: str = SCHEME_VERSION,
) -> dict:
    """Power curve and the share of reward variance found with probability `target` for one shape."""
    shape = (int(shape[0]), int(shape[1]))
    N = len(sigmas)
    t0 = time.perf_counter()
    curve: list[dict] = []

    def power_at(share: float) -> float:
        hits = sum(
            detects(
                shape,
                sigmas,
                share,
                (seed, shape[0], shape[1], j),
                splits,
                permutations,
                ranks,
                significance,
                planted_rank,
                budget_bytes,
                scheme,
            )
            for j in range(sims)
        )
        lo, hi = wilson(hits, sims)
        curve.append({"share": share, "power": hits / sims, "found": hits, "sims": sims, "ci95": [lo, hi]})
        return hits / sims

    full = power_at(1.0)
    out = {
        "shape": list(shape),
        "share_at_target": None,
        "rho_at_target": None,
        "bracket": None,
        "power_at_full_share": full,
        "power_at_full_share_ci95": curve[0]["ci95"],
        "edge_share": edge_share(shape, N, planted_rank),
        "n_edge_full_share": math.ceil(2 * planted_rank * math.sqrt(shape[0] * shape[1])),
    }
    if full >= target:
        lo, hi = max(1e-6, min(1e-3, out["edge_share"] / 16)), 1.0
        for _ in range(MAX_STEPS):
            if hi / lo <= BRACKET_RATIO:
                break
            mid = math.sqrt(lo * hi)
            if power_at(mid) >= target:
                hi = mid
            else:
                lo = mid
        out.update(share_at_target=hi, rho_at_target=math.sqrt(hi), bracket=[lo, hi])
    out["curve"] = sorted(curve, key=lambda c: c["share"])
    out["seconds"] = time.perf_counter() - t0
    return out


def analysis_power(
    shapes: Sequence[Sequence[int]],
    sigmas: Sequence[float],
    splits: int,
    permutations: int,
    ranks: Sequence[int],
    significance: float,
    sims: int = 32,
    seed: int = 0,
    planted_rank: int = 1,
    max_shapes: int = 4,
    target: float = POWER_TARGET,
    budget_bytes: int = 1 << 30,
    scheme: str = SCHEME_VERSION,
    threads: int | None = 1,
) -> dict:
    """The power block of rank_summary.json: per representative shape, the share of reward variance
    a planted rank-`planted_rank` direction must explain to be found with probability `target`."""
    if sims < 1:
        raise CorpError(f"--power-sims must be >= 1 to simulate power, got {sims}")
    if planted_rank < 1:
        raise CorpError(f"--power-rank must be >= 1, got {planted_rank}")
    if len(sigmas) < 4:
        raise CorpError(f"the power simulation needs at least 4 specialists, got {len(sigmas)}")
    kept, left_out = shape_classes(shapes, max_shapes)
    t0 = time.perf_counter()
    rows = []
    with one_thread(threads or torch.get_num_threads()):
        for c in kept:
            rows.append(
                {
                    "matrices": c["matrices"],
                    **shape_power(
                        c["shape"],
                        sigmas,
                        splits,
                        permutations,
                        ranks,
                        significance,
                        sims,
                        seed,
                        planted_rank,
                        target,
                        budget_bytes,
                        scheme,
                    ),
                }
            )
    found = [r["share_at_target"] for r in rows if r["share_at_target"] is not None]
    return {
        "target_power": target,
        "planted_rank": planted_rank,
        "sims_per_point": sims,
        "n_specialists": len(sigmas),
        "splits": splits,
        "permutations": permutations,
        "significance": significance,
        "ranks": list(ranks),
        "unit": (
            "share of reward variance explained by the planted direction (rho^2; "
            "rho = correlation between reward and the specialists' projection on it)"
        ),
        "model": (
            "reward_i = rho * x_i / sd(x) + sqrt(1 - rho^2) * e_i, x_i = <D, sigma_i eps_i>, D a unit-norm rank-r "
            "matrix, e_i ~ N(0, 1); found = r* >= 1 under the analysis's own rule"
        ),
        "shapes": rows,
        "shapes_left_out": left_out,
        "smallest_share_at_target": min(found) if found else None,
        "seconds": time.perf_counter() - t0,
    }


def power_lines(p: dict) -> list[str]:
    """Printed lines of the power block."""
    r = p["planted_rank"]
    what = "a direction" if r == 1 else f"a rank-{r} subspace"
    lines = [
        f"power (planted rank-{r} signal, N = {p['n_specialists']}, S = {p['splits']}, P = {p['permutations']}, "
        f"{p['sims_per_point']} simulations per point, {p['seconds']:.0f} s): share of reward variance {what} of one "
        f"matrix must explain to be found (r* > 0) with probability {p['target_power']:.1f}:"
    ]
    for s in p["shapes"]:
        head = f"  {s['shape'][0]}x{s['shape'][1]} ({s['matrices']} matrices): "
        if s["share_at_target"] is None:
            lo, hi = s["power_at_full_share_ci95"]
            lines.append(
                head + f"not reached at this N: even {what} explaining ALL reward variance "
                f"is found with probability {s['power_at_full_share']:.2f} "
                f"(95% CI {lo:.2f}-{hi:.2f}); random-matrix estimate: "
                f"N >= {s['n_edge_full_share']} before it shows at all"
            )
        else:
            lo, hi = s["bracket"]
            lines.append(
                head + f"{s['share_at_target']:.3g} (rho = {s['rho_at_target']:.2f}; between {lo:.3g} and {hi:.3g}; "
                f"random-matrix edge {s['edge_share']:.3g})"
            )
    if p["shapes_left_out"]:
        lines.append(
            "  not simulated (rarer shapes): "
            + ", ".join(f"{s['shape'][0]}x{s['shape'][1]} ({s['matrices']})" for s in p["shapes_left_out"])
        )
    return lines


def power_sentence(p: dict) -> str:
    """One sentence for a README or the conclusion line: what the analysis could have found."""
    n = p["n_specialists"]
    if p["smallest_share_at_target"] is None:
        return (
            f"at N = {n} it would not find (with {p['target_power']:.0%} power) even a "
            "single direction carrying all of the reward variance in any of the "
            f"{sum(s['matrices'] for s in p['shapes'])} matrices of the simulated shapes"
        )
    return (
        f"at N = {n} it would find, with {p['target_power']:.0%} power, only a direction explaining at least "
        f"{p['smallest_share_at_target']:.2g} of the reward variance in one matrix (smallest over shapes)"
    )
