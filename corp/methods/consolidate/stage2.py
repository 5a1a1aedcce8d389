"""CoRP stage 2: re-centring rounds around the stage-1 centre (arXiv 2605.31494; docs/methods.md "CoRP").

Each round samples a local population around the current centre, mixing isotropic noise with noise
along the top principal directions of the elite cloud (kernel PCA from the stage-1 Gram matrix, so
the directions stay seed combinations), scores it on a select half of the support split, merges it
as in stage 1 (alpha chosen on that half), and gates the candidate against the centre on the other
half AND on the probe; sigma halves on rejection; it stops after two accepts or two consecutive
rejects. Departures, as in stage 1 (docs/methods.md must-haves): every commit is gated, the move too
(a final validation gate against the base decides between the moved centre and the stage-1
result), and the low-rank term is scaled to the same expected norm as the isotropic term (the
public code's sigma * sqrt(eigenvalue) makes it vanish).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from corp.algorithms.corp_operator.algebra import combine, principal_directions
from corp.algorithms.corp_operator.config import OperatorConfig
from corp.algorithms.corp_operator.stage1 import ConsolidationResult, ScoreFn, gate_on, mean_score, merge_and_search
from corp.algorithms.perturb import SCHEME_VERSION, Direction, specialist_seeds
from corp.errors import CorpError


def local_population(
    seeds: Sequence[int], scale: float, pcs: Sequence[Direction], pc_mix: float, dim: int, rng: np.random.Generator
) -> list[Direction]:
    """p_j = scale * (sqrt(1 - g) eps(seed_j) + sqrt(g) sqrt(dim / K) sum_k z_jk u_k), z ~ N(0, I).

    Both terms have expected squared norm scale^2 * dim * (share), so pc_mix is the share of the
    variance along the principal directions: the consistent-units fix for the public code's
    sigma * sqrt(eigenvalue) scaling, under which the low-rank term vanishes."""
    g = pc_mix if pcs else 0.0
    out = []
    for s in seeds:
        iso = Direction.single(int(s), scale, math.sqrt(1.0 - g))
        if g > 0:
            z = rng.standard_normal(len(pcs))
            low = combine(pcs, scale * math.sqrt(g * dim / len(pcs)) * z)
            out.append(iso + low)
        else:
            out.append(iso)
    return out


def consolidate_stage2(
    first: ConsolidationResult,
    params: Sequence[tuple[str, torch.Size]],
    score: ScoreFn,
    cfg: OperatorConfig,
    *,
    seed: int = 0,
    select: str = "support_select",
    gate_half: str = "support_gate",
    probe: str = "probe",
    validation: str = "validation",
    progress: bool = True,
    gram_cache=None,
    scheme: str = SCHEME_VERSION,
    perturber=None,
) -> ConsolidationResult:
    """Up to cfg.rounds re-centring rounds around the stage-1 centre (base if stage 1 abstained).

    `seed` is the run's master seed (the local populations' seeds derive from it). Each round's
    candidates are centre + alpha * m with m a merged term of the local population, so the centre
    is a cached prefix and M is built once per round (`perturber`: the backend's, as in stage 1)."""
    if not first.perts:
        raise CorpError("stage 2 needs the stage-1 population (ConsolidationResult.perts is empty)")
    dim = int(sum(int(np.prod(s)) for _, s in params))
    centre = first.direction
    pcs = (
        principal_directions(first.best_stage.elite, first.perts, first.gram, cfg.pcs)
        if first.best_stage is not None
        else []
    )
    scale = float(np.median([p.seed_components()[0].sigma for p in first.perts]))
    accepts = rejects_in_a_row = 0
    rounds: list[dict] = []
    halves = (select, gate_half, probe)  # where a round scores its population, gates on the support half, on probe
    search = (progress, gram_cache, scheme, perturber)  # passed through to merge_and_search
    for t in range(cfg.rounds):
        if accepts >= 2 or rejects_in_a_row >= 2:
            break
        best, record = _round(t, centre, scale, pcs, dim, params, score, cfg, seed, halves, search)
        ok = record["accepted"]
        rounds.append(record)
        if ok:
            centre, accepts, rejects_in_a_row = best.direction, accepts + 1, 0
        else:
            scale, rejects_in_a_row = scale * 0.5, rejects_in_a_row + 1
    if hasattr(score, "cache_prefix"):
        score.cache_prefix(None)
    result = ConsolidationResult(**{**first.__dict__, "rounds": rounds})
    if accepts == 0:
        return result
    _final_gate(result, first, centre, accepts, score, validation, cfg.gate_z)
    return result


def _round(t, centre, scale, pcs, dim, params, score, cfg, seed, halves, search):
    """Round t: a local population around the centre, scored on `select`, merged and searched as in
    stage 1; its best candidate must pass the gate on the support half and on the probe split.
    Returns (that candidate, the round's record)."""
    select, gate_half, probe = halves
    progress, gram_cache, scheme, perturber = search
    seeds = specialist_seeds(seed * 1000 + 1 + t, cfg.local_population)
    rng = np.random.default_rng([seed, 2, t])
    local = local_population(seeds, scale, pcs, cfg.pc_mix, dim, rng)
    if hasattr(score, "cache_prefix"):
        score.cache_prefix(centre)
    bar = tqdm(local, desc=f"stage 2 round {t + 1}", unit="spec", disable=not progress, dynamic_ncols=True)
    rewards = [mean_score(score(centre + p, select)) for p in bar]
    bar.close()
    _, cands, _ = merge_and_search(
        rewards, local, params, score, cfg, select, centre, progress, None, gram_cache, scheme, perturber
    )
    best = max(cands[cfg.merge_rules[0]], key=lambda c: c.probe_score)
    g_half = gate_on(score, best.direction, centre, gate_half, cfg.gate_z)
    g_probe = gate_on(score, best.direction, centre, probe, cfg.gate_z)
    ok = g_half.accepted and g_probe.accepted
    return best, {
        "round": t + 1,
        "sigma": scale,
        "n_local": len(local),
        "pcs": len(pcs),
        "reward_best": max(rewards),
        "reward_mean": mean_score(rewards),
        "candidate": best.name,
        "gate_support_half": g_half.to_dict(),
        "gate_probe": g_probe.to_dict(),
        "accepted": ok,
    }


def _final_gate(result: ConsolidationResult, first: ConsolidationResult, centre, accepts, score, validation, z) -> None:
    """The moved centre replaces stage 1's result only if it passes the validation gate against base."""
    final = gate_on(score, centre, None, validation, z)
    if final.accepted:
        result.direction, result.accepted, result.gate = centre, True, final
        result.reason = f"stage 2 moved the centre in {accepts} round(s); final validation gate {final.reason}"
    else:
        result.reason = (
            first.reason
            + f"; stage 2's centre failed the final validation gate ({final.reason}), so the stage-1 result stands"
        )
