"""CoRP: Consolidating Rewarded Perturbations into one model (arXiv 2605.31494).

Stage 1 (METHODS.md, "CoRP"): elite set E = {i : r_i >= quantile_q(r)}; pass-1 weights
w1 = softmax(beta r) over E and provisional mean m1 = sum w1_i sigma_i eps_i; compatibility of each
elite with m1 (alignment a_i = cos(sigma_i eps_i, m1), dispersion d_i = |part of sigma_i eps_i
orthogonal to m1|^2); pass-2 logits beta r_i + z(a_i) - z(d_i), w2 = softmax, m2 = sum w2_i sigma_i
eps_i; the deployed update is alpha m2 with alpha chosen on the probe split; a paired
lower-confidence-bound gate on the validation split decides between it and the base (abstain).

Where we depart from the paper's public code, and why (METHODS.md lists these as must-haves):
- Every commit is gated, stage 1 included (the public code commits stage 1 unconditionally).
- Amplitudes are in one unit: the update is alpha * m2, where m2 is a convex combination of the
  elites' own perturbations sigma_i eps_i (no sigma-squared single-seed step, no low-rank term
  scaled by sigma * sqrt(eigenvalue)); in stage 2 the low-rank term is scaled to the same expected
  norm as the isotropic term.
- Noise is iid per tensor (DESIGN.md "Noise"), not one seed reused for every tensor.
- Compatibility terms are exact in weight space by default: the elites' Gram matrix
  <eps_i, eps_j> is accumulated in fp64 over every selected tensor, regenerating noise tensor by
  tensor; `--compat seed-orthogonal` treats distinct seeds as orthogonal with equal norms
  (cos_i = w1_i sigma_i / sqrt(sum_j w1_j^2 sigma_j^2)) and the report shows how far the two differ.
- The consolidated weights are saved as a normal HF model, with a recipe that rebuilds them.
- Hyper-parameters (q, beta, alpha) are searched on the probe split over grids; the CPU defaults
  are small grids, `--preset paper` gives the paper's ranges.
Low-rank consolidation (`--low-rank auto|R`, ours, not the paper's; corp/consolidate/lowrank.py)
projects m1 and m2 per (q, beta) before the step search, via the `project` hook.
Stage 2 (re-centring rounds, `--rounds`) samples a local population around the accepted centre,
mixing isotropic noise with noise along the top principal directions of the elite cloud (kernel
PCA from the same Gram matrix, so directions stay seed combinations), scores it on a select half of
the support split, merges as in stage 1, and gates on the other half and on the probe; sigma
shrinks on rejection; it stops after two accepts or two consecutive rejects (METHODS.md).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from corp import CorpError
from corp.config import PopulationConfig, parse_list
from corp.consolidate.gate import MIN_PROBE, MIN_VALIDATION, GateResult, paired_gate
from corp.perturb import Component, Direction, noise

PAPER_PRESET = {"quantiles": [0.5, 0.7, 0.9], "betas": [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0], "alphas": [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]}


@dataclass
class ConsolidateConfig(PopulationConfig):
    population: int = 64
    """N: number of specialists (distinct seeds) to score."""
    quantiles: list[float] = field(default_factory=lambda: [0.5])
    """Elite quantiles q to search (elite = reward >= q-quantile), comma-separated."""
    betas: list[float] = field(default_factory=lambda: [10.0])
    """Softmax inverse temperatures beta on rewards to search, comma-separated."""
    alphas: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    """Step sizes alpha (update = alpha * m2) to search on the probe split, comma-separated."""
    preset: str | None = None
    """'paper': the paper's grids for q, beta and alpha (overrides the three lists above)."""
    compat: str = "exact"
    """Compatibility terms: 'exact' (weight-space Gram matrix, fp64) or 'seed-orthogonal' (cheap)."""
    gate_z: float = 1.0
    """z of the validation gate's lower confidence bound (accept if mean - z sd / sqrt(n) > 0)."""
    rounds: int = 0
    """Stage-2 re-centring rounds (0 = stage 1 only)."""
    local_population: int = 16
    """Stage 2: specialists sampled around the centre per round."""
    pcs: int = 2
    """Stage 2: principal directions of the elite cloud mixed into the local noise."""
    pc_mix: float = 0.5
    """Stage 2: share of the local noise variance along the principal directions (0..1)."""
    top_k: list[int] = field(default_factory=lambda: [1, 4, 16])
    """RandOpt ensemble sizes K reported beside CoRP, comma-separated."""
    gram_memory_gb: float = 2.0
    """Memory budget for the stacked noise used to build the exact Gram matrix."""
    low_rank: str = "off"
    """Low-rank consolidation (ours): off; auto (each matrix's block of m2 projected on its top-r* subspace, r* from `corp analyze-rank`; unanalysed parameters get no update); or an integer R (every 2-D matrix rank R, 1-D none)."""
    rank_from: str | None = None
    """Run directory whose analyze-rank output gives r* for --low-rank auto (default: --population-from, else this run)."""
    export_lora: bool = False
    """Also write the low-rank update as a PEFT LoRA adapter to RUN_DIR/lora/ (needs --low-rank auto or R)."""

    def validate(self) -> "ConsolidateConfig":
        super().validate()
        if self.preset not in (None, "", "paper"):
            raise CorpError(f"--preset '{self.preset}' is unknown; the only preset is 'paper'")
        if self.preset == "paper":
            self.quantiles, self.betas, self.alphas = (list(PAPER_PRESET[k]) for k in ("quantiles", "betas", "alphas"))
        self.quantiles = parse_list(self.quantiles, float, "quantiles")
        self.betas = parse_list(self.betas, float, "betas")
        self.alphas = parse_list(self.alphas, float, "alphas")
        self.top_k = sorted(set(parse_list(self.top_k, int, "top_k")))
        for name, values, ok, rule in (
            ("quantiles", self.quantiles, lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
            ("betas", self.betas, lambda v: v >= 0 and math.isfinite(v), ">= 0"),
            ("alphas", self.alphas, lambda v: v > 0 and math.isfinite(v), "> 0"),
        ):
            valid = [v for v in values if ok(v)]
            if not valid:
                raise CorpError(f"--{name} has no valid value (each must be {rule}); got {values}")
            if len(valid) < len(values):
                raise CorpError(f"--{name} value(s) {[v for v in values if not ok(v)]} are not {rule}")
        if self.compat not in ("exact", "seed-orthogonal"):
            raise CorpError(f"--compat must be 'exact' or 'seed-orthogonal', got '{self.compat}'")
        if self.rounds < 0 or self.local_population < 2 or self.pcs < 0 or not 0.0 <= self.pc_mix <= 1.0:
            raise CorpError("need --rounds >= 0, --local-population >= 2, --pcs >= 0 and 0 <= --pc-mix <= 1")
        if not self.top_k or min(self.top_k) < 1 or max(self.top_k) > self.population:
            raise CorpError(f"--top-k values must be in 1..--population ({self.population}); got {self.top_k}")
        from corp.consolidate.lowrank import parse_low_rank

        self.low_rank = parse_low_rank(self.low_rank)
        if self.low_rank != "off" and self.rounds > 0:
            raise CorpError(f"--low-rank {self.low_rank} cannot be combined with --rounds {self.rounds}: stage-2 re-centring is full-rank; use --rounds 0")
        if self.export_lora and self.low_rank == "off":
            raise CorpError("--export-lora needs a low-rank update: add --low-rank auto or --low-rank R")
        if self.rank_from is not None and self.low_rank != "auto":
            raise CorpError("--rank-from only applies to --low-rank auto")
        if self.rank_from is not None and not Path(self.rank_from).is_dir():
            raise CorpError(f"--rank-from '{self.rank_from}' is not a directory")
        if self.n_validation < MIN_VALIDATION:
            warnings.warn(f"--n-validation {self.n_validation} is too small for the gate to mean much; use at least {MIN_VALIDATION}")
        if self.n_probe < MIN_PROBE:
            warnings.warn(f"--n-probe {self.n_probe} is too small to choose a step size reliably; use at least {MIN_PROBE}")
        return self


# ---------------------------------------------------------------- weight-space geometry


def gram_matrix(params: Sequence[tuple[str, torch.Size]], seeds: Sequence[int], memory_gb: float = 2.0, progress: bool = True, cache_dir=None) -> np.ndarray:
    """G_ij = <eps(seed_i), eps(seed_j)> over all `params`, accumulated in fp64.

    Noise is regenerated tensor by tensor; when a tensor's stacked noise for all seeds would exceed
    the memory budget, seeds are processed in row blocks (regenerating a block once per pair).
    With `cache_dir`, the result is stored there keyed by (noise scheme, tensors, seeds), so a
    resumed run does not pay for it twice.
    """
    if cache_dir is not None:
        import hashlib
        from pathlib import Path

        from corp.perturb import SCHEME_VERSION

        key = hashlib.sha1(repr((SCHEME_VERSION, [(n, tuple(s)) for n, s in params], [int(x) for x in seeds])).encode()).hexdigest()[:16]
        path = Path(cache_dir) / f"gram-{key}.npy"
        if path.exists():
            return np.load(path)
        G = gram_matrix(params, seeds, memory_gb, progress)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, G)
        tmp.replace(path)
        return G
    k = len(seeds)
    G = torch.zeros((k, k), dtype=torch.float64)
    gen = torch.Generator(device="cpu")
    budget = max(1, int(memory_gb * 2**30))
    chunk = 1 << 20  # elements per fp64 matmul chunk

    def stack(idx: Sequence[int], name: str, shape) -> torch.Tensor:
        n = int(np.prod(shape))
        out = torch.empty((len(idx), n), dtype=torch.float32)
        for r, i in enumerate(idx):
            noise(seeds[i], name, shape, gen, out=out[r].view(shape))
        return out

    bar = tqdm(params, desc="gram (exact compat)", unit="tensor", disable=not progress, dynamic_ncols=True)
    for name, shape in bar:
        n = int(np.prod(shape))
        rows = max(1, min(k, budget // (4 * n)))
        blocks = [list(range(s, min(s + rows, k))) for s in range(0, k, rows)]
        for bi, I in enumerate(blocks):
            SI = stack(I, name, shape)
            for J in blocks[bi:]:
                SJ = SI if J is I else stack(J, name, shape)
                acc = torch.zeros((len(I), len(J)), dtype=torch.float64)
                for c in range(0, n, chunk):
                    acc += SI[:, c : c + chunk].double() @ SJ[:, c : c + chunk].double().T
                G[np.ix_(I, J)] += acc
                if J is not I:
                    G[np.ix_(J, I)] += acc.T
    bar.close()
    return G.numpy()


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max()
    e = np.exp(z)
    return e / e.sum()


def _zscore(x: np.ndarray) -> np.ndarray:
    sd = x.std()
    if not np.isfinite(sd) or sd < 1e-12 * max(1.0, np.abs(x).max()):
        return np.zeros_like(x)
    return (x - x.mean()) / sd


def combine(perts: Sequence[Direction], weights: Sequence[float]) -> Direction:
    """sum_j w_j p_j as one Direction; components with the same (seed, sigma) are merged."""
    acc: dict[tuple[int, float], float] = {}
    for p, w in zip(perts, weights):
        for c in p.components:
            key = (c.seed, c.sigma)
            acc[key] = acc.get(key, 0.0) + float(w) * c.coef
    return Direction([Component(s, sg, cf) for (s, sg), cf in acc.items() if cf != 0.0])


def seed_basis(perts: Sequence[Direction]) -> tuple[list[int], np.ndarray]:
    """Write each perturbation as p_j = sum_b C[j, b] eps(seed_b): the seed basis and C (sigma absorbed)."""
    seeds: list[int] = []
    index: dict[int, int] = {}
    for p in perts:
        for c in p.components:
            if c.seed not in index:
                index[c.seed] = len(seeds)
                seeds.append(c.seed)
    C = np.zeros((len(perts), len(seeds)))
    for j, p in enumerate(perts):
        for c in p.components:
            C[j, index[c.seed]] += c.coef * c.sigma
    return seeds, C


@dataclass
class Stage1:
    """The two passes of stage 1 for one (q, beta): elites, weights and compatibility terms."""

    q: float
    beta: float
    elite: list[int]  # indices into the population
    w1: np.ndarray
    alignment: np.ndarray
    dispersion: np.ndarray
    w2: np.ndarray
    alignment_approx: np.ndarray  # seed-orthogonal approximation, always computed for the report
    w2_approx: np.ndarray

    def direction(self, perts: Sequence[Direction], which: str = "m2") -> Direction:
        w = {"m1": self.w1, "m2": self.w2}[which]
        return combine([perts[i] for i in self.elite], w)

    def to_dict(self, perts: Sequence[Direction]) -> dict:
        return {
            "q": self.q,
            "beta": self.beta,
            "elite": [perts[i].to_json() for i in self.elite] if any(len(perts[i].components) > 1 for i in self.elite) else [perts[i].components[0].seed for i in self.elite],
            "w1": self.w1.tolist(),
            "alignment": self.alignment.tolist(),
            "dispersion": self.dispersion.tolist(),
            "w2": self.w2.tolist(),
            "compat_disagreement": {
                "max_abs_alignment_diff": float(np.abs(self.alignment - self.alignment_approx).max()),
                "w2_l1_diff": float(np.abs(self.w2 - self.w2_approx).sum()),
            },
        }


def elite_set(rewards: np.ndarray, q: float) -> list[int]:
    thr = np.quantile(rewards, q)
    return [i for i in range(len(rewards)) if rewards[i] >= thr]


def compat_terms(w1: np.ndarray, Gp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Alignment cos(p_i, m1) and dispersion |p_i - proj_m1 p_i|^2 of each elite perturbation p_i,
    from the elites' Gram matrix Gp = <p_i, p_j> and m1 = sum_j w1_j p_j."""
    inner = Gp @ w1  # <p_i, m1>
    m1_sq = float(w1 @ Gp @ w1)
    own_sq = np.diag(Gp).copy()
    if m1_sq <= 0:
        return np.zeros_like(w1), own_sq
    alignment = inner / np.sqrt(np.maximum(own_sq, 1e-300) * m1_sq)
    dispersion = own_sq - inner**2 / m1_sq
    return alignment, dispersion


def stage1(rewards: np.ndarray, q: float, beta: float, Gp_exact: np.ndarray | None, Gp_approx: np.ndarray) -> Stage1:
    """Both passes for one (q, beta). Gp_* are N x N Gram matrices of the perturbations: exact
    (None: use the approximation) and seed-orthogonal (distinct seeds orthogonal, |eps|^2 = dim)."""
    E = elite_set(rewards, q)
    r = rewards[E]
    w1 = _softmax(beta * r)
    a_apx, d_apx = compat_terms(w1, Gp_approx[np.ix_(E, E)])
    a, d = compat_terms(w1, Gp_exact[np.ix_(E, E)]) if Gp_exact is not None else (a_apx, d_apx)
    w2 = _softmax(beta * r + _zscore(a) - _zscore(d))
    w2_apx = _softmax(beta * r + _zscore(a_apx) - _zscore(d_apx))
    return Stage1(q, beta, E, w1, a, d, w2, a_apx, w2_apx)


def perturbation_grams(perts: Sequence[Direction], params, exact_for: Sequence[int] | None, memory_gb: float, progress: bool, cache_dir=None) -> tuple[np.ndarray | None, np.ndarray]:
    """(exact Gram or None, seed-orthogonal Gram) of the perturbations; the exact one only over
    `exact_for` (the widest elite set), the rest left zero (never read)."""
    dim = int(sum(int(np.prod(s)) for _, s in params))
    seeds, C = seed_basis(perts)
    approx = dim * (C @ C.T)
    if exact_for is None:
        return None, approx
    idx = list(exact_for)
    cols = sorted({b for j in idx for b in np.nonzero(C[j])[0]})
    G_seed = gram_matrix(params, [seeds[b] for b in cols], memory_gb, progress, cache_dir)
    Csub = C[np.ix_(idx, cols)]
    exact = np.zeros_like(approx)
    exact[np.ix_(idx, idx)] = Csub @ G_seed @ Csub.T
    return exact, approx


# ---------------------------------------------------------------- search and gate

ScoreFn = Callable[[Direction | None, str], list[float]]  # per-example scores of base + direction on a split


@dataclass
class Candidate:
    name: str  # e.g. "m2 q=0.5 beta=10 alpha=4"
    direction: Direction
    probe_score: float
    params: dict


@dataclass
class ConsolidationResult:
    direction: Direction  # what is deployed (empty = the base: abstain)
    accepted: bool
    gate: GateResult
    best: Candidate
    probe_table: list[dict]
    stage1: list[dict]
    pass1_gate: GateResult | None
    rounds: list[dict]
    reason: str
    # kept for stage 2: the population, its Gram matrix and the chosen stage-1 weights
    perts: list[Direction] = field(default_factory=list, repr=False)
    gram: np.ndarray | None = field(default=None, repr=False)
    best_stage: Stage1 | None = field(default=None, repr=False)


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def search_step(stage: Stage1, perts: Sequence[Direction], alphas: Sequence[float], score: ScoreFn, probe: str, which: str = "m2", centre: Direction | None = None,
                project: Callable[[Direction], Direction] | None = None) -> list[Candidate]:
    """Score centre + alpha * m (m = m1 or m2) on the probe split for every alpha.

    `project` (low-rank consolidation) maps m to its projection once; the projection is linear, so
    P(alpha m) = alpha P(m) and the step search scales the projected direction."""
    m = stage.direction(perts, which)
    if project is not None:
        m = project(m)
    out = []
    for alpha in alphas:
        d = m.scaled(alpha) if centre is None else centre + m.scaled(alpha)
        out.append(Candidate(f"{which} q={stage.q:g} beta={stage.beta:g} alpha={alpha:g}", d, _mean(score(d, probe)), {"pass": which, "q": stage.q, "beta": stage.beta, "alpha": alpha}))
    return out


def merge_and_search(
    rewards: Sequence[float],
    perts: Sequence[Direction],
    params: Sequence[tuple[str, torch.Size]],
    score: ScoreFn,
    quantiles: Sequence[float],
    betas: Sequence[float],
    alphas: Sequence[float],
    compat: str,
    probe: str,
    centre: Direction | None = None,
    gram_memory_gb: float = 2.0,
    progress: bool = True,
    project: Callable[[Direction], Direction] | None = None,
    gram_cache=None,
) -> tuple[list[Stage1], list[Candidate], list[Candidate], np.ndarray]:
    """Stage-1 weights for every (q, beta), the probe score of centre + alpha * m for m1 and m2, and
    the Gram matrix of the perturbations that was used (exact where computed)."""
    r = np.asarray(rewards, dtype=np.float64)
    widest = sorted(set().union(*(elite_set(r, q) for q in quantiles)))
    Gp_exact, Gp_approx = perturbation_grams(perts, params, widest if compat == "exact" else None, gram_memory_gb, progress, gram_cache)
    stages = [stage1(r, q, b, Gp_exact, Gp_approx) for q in quantiles for b in betas]
    cands_m1: list[Candidate] = []
    cands_m2: list[Candidate] = []
    bar = tqdm(total=2 * len(stages) * len(alphas), desc=f"step search ({probe})", unit="cand", disable=not progress, dynamic_ncols=True)

    def counted(direction, split):
        out = score(direction, split)
        bar.update(1)
        return out

    for st in stages:
        cands_m2 += search_step(st, perts, alphas, counted, probe, "m2", centre, project)
        cands_m1 += search_step(st, perts, alphas, counted, probe, "m1", centre, project)
    bar.close()
    return stages, cands_m1, cands_m2, Gp_exact if Gp_exact is not None else Gp_approx


def consolidate_stage1(
    rewards: Sequence[float],
    seeds: Sequence[int],
    sigmas: Sequence[float],
    params: Sequence[tuple[str, torch.Size]],
    score: ScoreFn,
    quantiles: Sequence[float] = (0.5,),
    betas: Sequence[float] = (10.0,),
    alphas: Sequence[float] = (1.0, 2.0, 4.0, 8.0),
    compat: str = "exact",
    gate_z: float = 1.0,
    probe: str = "probe",
    validation: str = "validation",
    gram_memory_gb: float = 2.0,
    progress: bool = True,
    project: Callable[[Direction], Direction] | None = None,
    gram_cache=None,
) -> ConsolidationResult:
    """Stage 1 end to end: weights for every (q, beta), step search on probe, gate on validation.

    Ties on the probe go to the earlier grid point (smaller q, beta, alpha), so the choice is
    deterministic. Pass 1 (m1) is searched and gated too, for the report; only m2 is deployed.
    `project` (low-rank consolidation, corp/consolidate/lowrank.py) replaces m1 and m2 by their
    projections before the step search, so the probe and the gate judge what is deployed.
    """
    perts = [Direction.single(s, sg) for s, sg in zip(seeds, sigmas)]
    stages, cands_m1, cands_m2, Gp = merge_and_search(rewards, perts, params, score, quantiles, betas, alphas, compat, probe, None, gram_memory_gb, progress, project, gram_cache)
    best = max(cands_m2, key=lambda c: c.probe_score)  # max keeps the first among ties
    best_m1 = max(cands_m1, key=lambda c: c.probe_score)
    base_val = score(None, validation)
    gate = paired_gate(score(best.direction, validation), base_val, gate_z)
    gate_m1 = paired_gate(score(best_m1.direction, validation), base_val, gate_z)
    table = [{"candidate": "base", "probe_score": _mean(score(None, probe)), "pass": "base"}]
    table += [{"candidate": c.name, "probe_score": c.probe_score, **c.params} for c in cands_m1 + cands_m2]
    reason = f"stage 1 candidate '{best.name}' {gate.reason}"
    return ConsolidationResult(
        direction=best.direction if gate.accepted else Direction(),
        accepted=gate.accepted,
        gate=gate,
        best=best,
        probe_table=table,
        stage1=[st.to_dict(perts) for st in stages],
        pass1_gate=gate_m1,
        rounds=[],
        reason=reason if gate.accepted else reason + "; abstaining: the output is the base model",
        perts=list(perts),
        gram=Gp,
        best_stage=next(st for st in stages if st.q == best.params["q"] and st.beta == best.params["beta"]),
    )


# ---------------------------------------------------------------- stage 2: re-centring rounds


def principal_directions(stage: Stage1, perts: Sequence[Direction], Gp: np.ndarray, k: int) -> list[Direction]:
    """Top-k unit-norm principal directions of the elite cloud {p_i}, as seed combinations.

    Kernel PCA: with centred Gram K = H Gp H (H = I - 11^T/n), eigenpairs (lambda, v) give the unit
    direction u = sum_j v_j p_j / sqrt(lambda) (v is orthogonal to 1, so centring drops out).
    """
    E = stage.elite
    n = len(E)
    if k <= 0 or n < 2:
        return []
    H = np.eye(n) - 1.0 / n
    K = H @ Gp[np.ix_(E, E)] @ H
    vals, vecs = np.linalg.eigh((K + K.T) / 2)
    out = []
    for idx in np.argsort(vals)[::-1][:k]:
        if vals[idx] <= 1e-12 * max(1.0, vals.max()):
            break
        out.append(combine([perts[i] for i in E], vecs[:, idx] / math.sqrt(vals[idx])))
    return out


def local_population(seeds: Sequence[int], scale: float, pcs: Sequence[Direction], pc_mix: float, dim: int, rng: np.random.Generator) -> list[Direction]:
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
    cfg: "ConsolidateConfig",
    select: str = "support_select",
    gate_half: str = "support_gate",
    probe: str = "probe",
    validation: str = "validation",
    progress: bool = True,
    gram_cache=None,
) -> ConsolidationResult:
    """Up to cfg.rounds re-centring rounds around the stage-1 centre (base if stage 1 abstained).

    Each round: a local population around the centre scored on `select`; merged as in stage 1 with
    alpha chosen on `select`; the candidate must beat the current centre on `gate_half` AND on
    `probe` (paired LCB gates); sigma halves on rejection; stop after two accepts or two consecutive
    rejects. If the centre moved, a last validation gate against the base decides between it and
    the stage-1 result, so the final commit is gated like every other.
    """
    from corp.perturb import specialist_seeds

    dim = int(sum(int(np.prod(s)) for _, s in params))
    centre = first.direction
    pcs = principal_directions(first.best_stage, first.perts, first.gram, cfg.pcs) if first.best_stage is not None else []
    scale = float(np.median([c.sigma for p in first.perts for c in p.components[:1]])) if first.perts else cfg.sigmas[0]
    accepts = rejects_in_a_row = 0
    rounds: list[dict] = []
    for t in range(cfg.rounds):
        if accepts >= 2 or rejects_in_a_row >= 2:
            break
        seeds = specialist_seeds(cfg.seed * 1000 + 1 + t, cfg.local_population)
        rng = np.random.default_rng([cfg.seed, 2, t])
        local = local_population(seeds, scale, pcs, cfg.pc_mix, dim, rng)
        if hasattr(score, "cache_prefix"):
            score.cache_prefix(centre)
        bar = tqdm(local, desc=f"stage 2 round {t + 1}", unit="spec", disable=not progress, dynamic_ncols=True)
        rewards = [_mean(score(centre + p, select)) for p in bar]
        bar.close()
        stages, _, cands, _ = merge_and_search(rewards, local, params, score, cfg.quantiles, cfg.betas, cfg.alphas, cfg.compat, select, centre, cfg.gram_memory_gb, progress, None, gram_cache)
        best = max(cands, key=lambda c: c.probe_score)
        centre_half, centre_probe = score(centre, gate_half), score(centre, probe)
        g_half = paired_gate(score(best.direction, gate_half), centre_half, cfg.gate_z)
        g_probe = paired_gate(score(best.direction, probe), centre_probe, cfg.gate_z)
        ok = g_half.accepted and g_probe.accepted
        rounds.append({"round": t + 1, "sigma": scale, "n_local": len(local), "pcs": len(pcs), "reward_best": max(rewards), "reward_mean": _mean(rewards),
                       "candidate": best.name, "gate_support_half": g_half.to_dict(), "gate_probe": g_probe.to_dict(), "accepted": ok})
        if ok:
            centre, accepts, rejects_in_a_row = best.direction, accepts + 1, 0
        else:
            scale, rejects_in_a_row = scale * 0.5, rejects_in_a_row + 1
    if hasattr(score, "cache_prefix"):
        score.cache_prefix(None)
    result = ConsolidationResult(**{**first.__dict__, "rounds": rounds})
    if accepts == 0:
        return result
    final = paired_gate(score(centre, validation), score(None, validation), cfg.gate_z)
    if final.accepted:
        result.direction, result.accepted, result.gate = centre, True, final
        result.reason = f"stage 2 moved the centre in {accepts} round(s); final validation gate {final.reason}"
    else:
        result.reason = first.reason + f"; stage 2's centre failed the final validation gate ({final.reason}), so the stage-1 result stands"
    return result
