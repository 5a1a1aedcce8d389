"""CoRP: Consolidating Rewarded Perturbations into one model (arXiv 2605.31494).

Stage 1 (docs/methods.md, "CoRP"): elite set E = {i : r_i >= quantile_q(r)}; pass-1 weights
w1 = softmax(beta r) over E and provisional mean m1 = sum w1_i sigma_i eps_i; compatibility of each
elite with m1 (alignment a_i = cos(sigma_i eps_i, m1), dispersion d_i = |part of sigma_i eps_i
orthogonal to m1|^2); pass-2 logits beta r_i + z(a_i) - z(d_i), w2 = softmax, m2 = sum w2_i sigma_i
eps_i; the deployed update is alpha m2 with alpha chosen on the probe split; a paired
lower-confidence-bound gate on the validation split decides between it and the base (abstain).

Where we depart from the paper's public code, and why (docs/methods.md lists these as must-haves):
- Every commit is gated, stage 1 included (the public code commits stage 1 unconditionally).
- Amplitudes are in one unit: the update is alpha * m2, where m2 is a convex combination of the
  elites' own perturbations sigma_i eps_i (no sigma-squared single-seed step, no low-rank term
  scaled by sigma * sqrt(eigenvalue)); in stage 2 the low-rank term is scaled to the same expected
  norm as the isotropic term.
- Noise is iid per tensor (docs/architecture.md "Noise"), not one seed reused for every tensor.
- Compatibility terms are exact in weight space by default: the elites' Gram matrix
  <eps_i, eps_j> is accumulated in fp64 over every selected tensor, regenerating noise tensor by
  tensor; `--compat seed-orthogonal` treats distinct seeds as orthogonal with equal norms
  (cos_i = w1_i sigma_i / sqrt(sum_j w1_j^2 sigma_j^2)) and the report shows how far the two differ.
- The consolidated weights are saved as a normal HF model, with a recipe that rebuilds them.
- Hyper-parameters (q, beta, alpha) are searched on the probe split over grids; the CPU defaults
  are small grids, `--preset paper` gives the paper's ranges.
Low-rank consolidation (`--low-rank auto|R`, ours, not the paper's; corp/methods/consolidate/lowrank.py)
projects m1 and m2 per (q, beta) before the step search, via the `project` hook.
Code layout: the operator is the core package corp/algorithms/corp_operator/, which `corp consolidate`
(corp/methods/consolidate/) and `corp fedcorp` (corp/methods/fedcorp/run.py) both import: config.py
(OperatorConfig), algebra.py (Gram matrix, combinations, compatibility terms, kernel PCA),
merge_rules/ (pass 1, pass 2: one file per rule, registered in MERGE_RULES), gate.py (the paired
gate), this file (stage 1: weights per (q, beta) and rule, step search, gate). Stage 2, which only
`corp consolidate` runs, is corp/methods/consolidate/stage2.py; ConsolidateConfig is corp/methods/consolidate/config.py.
Each merged direction m is one merged term (`Direction.merged`): M is materialised once in fp32 and
every step size evaluates W0 + alpha M (the Perturber keeps M), and the recipe names the same term,
so `corp apply` rebuilds exactly the evaluated weights.
On a low-rank population with the hf backend (`--noise lowrank:r=R`), `corp consolidate`'s scorer
(RunScorer) evaluates candidates in the factored pass instead: m = sum_k c_k E_k is, per matrix, one
factor pair of rank <= K R, every alpha scales it (the `prepare` hook hands search_step's alphas over
together, as row groups of one batched pass), no M is built and no weight is written; only the
deployed model is materialised, once, to be saved. Rewards equal the dense path's up to
floating-point rounding of the generations (tests/test_step_factored.py).
Stage 2 (re-centring rounds, `--stage2-rounds`, corp/methods/consolidate/stage2.py) samples a local population around the accepted centre,
mixing isotropic noise with noise along the top principal directions of the elite cloud (kernel
PCA from the same Gram matrix, so directions stay seed combinations), scores it on a select half of
the support split, merges as in stage 1, and gates on the other half and on the probe; sigma
shrinks on rejection; it stops after two accepts or two consecutive rejects (docs/methods.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from corp.algorithms.corp_operator.algebra import compat_terms, elite_set, merge, perturbation_grams
from corp.algorithms.corp_operator.config import OperatorConfig
from corp.algorithms.corp_operator.gate import GateResult, paired_gate
from corp.algorithms.corp_operator.merge_rules import MERGE_RULES, MergeParams
from corp.algorithms.perturb import SCHEME_VERSION, Direction, Perturber
from corp.algorithms.perturb.direction import Merged

__all__ = [
    "Stage1",
    "Candidate",
    "ConsolidationResult",
    "stage1",
    "merge_and_search",
    "consolidate_stage1",
    "gate_on",
]

ScoreFn = Callable[[Direction | None, str], list[float]]  # per-example scores of base + direction on a split
"""A ScoreFn may also have `example_ids(direction, split) -> ids` (the gates then check that both
sides cover the same examples in the same order), `cache_prefix(direction)` (stage 2) and
`prepare(directions, split)` (the step search hands it every step size of a direction first)."""


@dataclass
class Stage1:
    """Stage 1 for one (q, beta): the elites and every rule's weights over them."""

    q: float
    beta: float
    elite: list[int]  # indices into the population
    weights: dict[str, np.ndarray]  # rule -> weights over E, from the Gram matrix in use (exact where computed)
    weights_approx: dict[str, np.ndarray]  # the same rules on the seed-orthogonal approximation, for the report
    alignment: np.ndarray  # cos(p_i, m1), with the Gram matrix in use
    dispersion: np.ndarray
    alignment_approx: np.ndarray
    gram: np.ndarray = field(repr=False)  # <p_i, p_j> over E, as used

    @property
    def w1(self) -> np.ndarray:
        return self.weights["pass1"]

    @property
    def w2(self) -> np.ndarray:
        return self.weights["pass2"]

    def direction(self, perts: Sequence[Direction], rule: str = "pass2") -> Direction:
        """The rule's merged direction m = sum_E w_i p_i, one merged term (scaled per alpha)."""
        return merge([perts[i] for i in self.elite], self.weights[rule])

    def to_dict(self, perts: Sequence[Direction]) -> dict:
        G = self.gram
        norms = {r: float(np.sqrt(max(w @ G @ w, 0.0))) for r, w in self.weights.items()}
        w1 = self.weights["pass1"]
        versus = {}
        for r, w in self.weights.items():
            if r != "pass1":
                denom = norms[r] * norms["pass1"]
                versus[r] = {
                    "weights_l1_diff": float(np.abs(w - w1).sum()),
                    "norm_ratio": norms[r] / norms["pass1"] if norms["pass1"] > 0 else float("nan"),
                    "cosine": float(w @ G @ w1) / denom if denom > 0 else float("nan"),
                }
        out = {
            "q": self.q,
            "beta": self.beta,
            "elite": [perts[i].to_json() for i in self.elite]
            if any(len(perts[i].components) > 1 for i in self.elite)
            else [perts[i].components[0].seed for i in self.elite],
            "w1": w1.tolist(),
            "alignment": self.alignment.tolist(),
            "dispersion": self.dispersion.tolist(),
        }
        if "pass2" in self.weights:
            out["w2"] = self.weights["pass2"].tolist()
        out["weights"] = {r: w.tolist() for r, w in self.weights.items() if r not in ("pass1", "pass2")}
        out["norms"] = norms  # |m| per rule, from the Gram matrix in use
        out["vs_pass1"] = versus  # each rule against pass 1: L1 of weights, |m| / |m1|, cos(m, m1)
        out["compat_disagreement"] = {  # Gram in use vs the seed-orthogonal approximation (not pass 1 vs pass 2)
            "max_abs_alignment_diff": float(np.abs(self.alignment - self.alignment_approx).max()),
            "weights_l1_diff": {r: float(np.abs(w - self.weights_approx[r]).sum()) for r, w in self.weights.items()},
        }
        if "pass2" in self.weights:
            out["compat_disagreement"]["w2_l1_diff"] = out["compat_disagreement"]["weights_l1_diff"]["pass2"]
        return out


def stage1(
    rewards: np.ndarray,
    q: float,
    beta: float,
    Gp_exact: np.ndarray | None,
    Gp_approx: np.ndarray,
    rules: Sequence[str] = ("pass2", "pass1"),
) -> Stage1:
    """Every rule's weights for one (q, beta). Gp_* are N x N Gram matrices of the perturbations:
    exact (None: use the approximation) and seed-orthogonal (distinct seeds orthogonal, |eps|^2 = dim).
    Pass 1 is always computed: the compatibility terms in the report are relative to m1."""
    E = elite_set(rewards, q)
    r = rewards[E]
    mp = MergeParams(q, beta)
    G_apx = Gp_approx[np.ix_(E, E)]
    G = Gp_exact[np.ix_(E, E)] if Gp_exact is not None else G_apx
    names = list(dict.fromkeys([*rules, "pass1"]))
    weights = {n: np.asarray(MERGE_RULES[n].weights(r, G, mp), dtype=np.float64) for n in names}
    weights_apx = (
        {n: np.asarray(MERGE_RULES[n].weights(r, G_apx, mp), dtype=np.float64) for n in names}
        if Gp_exact is not None
        else dict(weights)
    )
    a, d = compat_terms(weights["pass1"], G)
    a_apx, _ = compat_terms(weights_apx["pass1"], G_apx)
    return Stage1(q, beta, E, weights, weights_apx, a, d, a_apx, G)


# ---------------------------------------------------------------- search and gate


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
    rule_gates: dict[str, GateResult] = field(default_factory=dict)  # every searched rule's best candidate, gated
    # kept for stage 2: the population, its Gram matrix and the chosen stage-1 weights
    perts: list[Direction] = field(default_factory=list, repr=False)
    gram: np.ndarray | None = field(default=None, repr=False)
    best_stage: Stage1 | None = field(default=None, repr=False)
    # wall seconds of stage 1's parts (gram, merge, step_search, gate), for where the time went
    seconds: dict[str, float] = field(default_factory=dict)


def mean_score(xs: Sequence[float]) -> float:
    """Mean of per-example scores (0 for none); stage 2 uses it too."""
    return float(sum(xs) / len(xs)) if xs else 0.0


def gate_on(
    score: ScoreFn, candidate: Direction | None, reference: Direction | None, split: str, z: float
) -> GateResult:
    """paired_gate of candidate vs reference on `split`, with the example ids checked when the
    score function can name them."""
    ids = getattr(score, "example_ids", None)
    kw = {} if ids is None else {"candidate_ids": ids(candidate, split), "base_ids": ids(reference, split)}
    return paired_gate(score(candidate, split), score(reference, split), z, **kw)


def search_step(
    stage: Stage1,
    perts: Sequence[Direction],
    alphas: Sequence[float],
    score: ScoreFn,
    probe: str,
    rule: str = "pass2",
    centre: Direction | None = None,
    project: Callable[[Direction], Direction] | None = None,
    prepare: Callable[[Sequence[Direction], str], None] | None = None,
) -> list[Candidate]:
    """Score centre + alpha * m (m = the rule's merged direction) on the probe split for every alpha.

    m is one merged term, so every alpha applies the same M (built once by the Perturber), or, in
    the factored pass of a low-rank population, every alpha scales the same factors of m.
    `prepare(directions, split)` (the score function's, when it has one) is handed every alpha's
    candidate first, so it can evaluate them together. `project` (low-rank consolidation) maps m to
    its projection once; the projection is linear, so P(alpha m) = alpha P(m) and the step search
    scales the projected direction."""
    label = MERGE_RULES[rule].label
    m = stage.direction(perts, rule)
    if project is not None:
        m = project(m)
    ds = [m.scaled(alpha) if centre is None else centre + m.scaled(alpha) for alpha in alphas]
    if prepare is not None:
        prepare(ds, probe)
    out = []
    for alpha, d in zip(alphas, ds):
        out.append(
            Candidate(
                f"{label} q={stage.q:g} beta={stage.beta:g} alpha={alpha:g}",
                d,
                mean_score(score(d, probe)),
                {"pass": label, "rule": rule, "q": stage.q, "beta": stage.beta, "alpha": alpha},
            )
        )
    return out


def keep_together(perturber: Perturber | None, directions: Sequence[Direction]) -> None:
    """Have the Perturber build the merged terms of `directions` in one pass (each elite's noise
    generated once for all of them); without a Perturber (another backend) nothing is kept."""
    if perturber is not None:
        perturber.keep_merged([t for d in directions for t in d.components if isinstance(t, Merged)])


def reward_scale(rewards: Sequence[float]) -> np.ndarray:
    """The rewards the merge rules see. beta acts on raw rewards (softmax(beta * r)), and the
    paper's beta grid assumes rewards in [0, 1] (accuracies): rewards that all lie there are used
    as they are (every built-in task); any other finite rewards (a custom TRL-style reward) are
    mapped to [0, 1] by the population's range, (r - min) / (max - min), so beta means the same.
    Elite quantiles are unchanged by this map; all-equal rewards become zeros."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0 or (r.min() >= 0.0 and r.max() <= 1.0):
        return r
    spread = r.max() - r.min()
    return np.zeros_like(r) if spread <= 0 else (r - r.min()) / spread


def _add(seconds: dict[str, float], part: str, since: float) -> None:
    seconds[part] = seconds.get(part, 0.0) + time.perf_counter() - since


def merge_and_search(
    rewards: Sequence[float],
    perts: Sequence[Direction],
    params: Sequence[tuple[str, torch.Size]],
    score: ScoreFn,
    cfg: OperatorConfig,
    probe: str,
    centre: Direction | None = None,
    progress: bool = True,
    project: Callable[[Direction], Direction] | None = None,
    gram_cache=None,
    scheme: str = SCHEME_VERSION,
    perturber: Perturber | None = None,
    release: bool = True,
    seconds: dict[str, float] | None = None,
) -> tuple[list[Stage1], dict[str, list[Candidate]], np.ndarray]:
    """Stage-1 weights for every (q, beta), the probe score of centre + alpha * m for every
    configured rule's m, and the Gram matrix of the perturbations that was used (exact where computed).

    With the backend's `perturber`, the merged directions are built in groups that fit
    cfg.merge_memory_gb (one fp32 model copy each), each group in one pass over the elites' noise,
    and freed after their alphas. Low-rank projection (`project`) materialises m itself, so then
    nothing is kept. `release=False`: the last group stays built (the caller gates some of them
    next and frees them with perturber.release_merged). `seconds`: adds the wall seconds of the Gram
    matrix (`gram`), of building merged directions (`merge`) and of the step search's scoring
    (`step_search`, generation included)."""
    timed = seconds if seconds is not None else {}
    r = reward_scale(rewards)
    widest = sorted(set().union(*(elite_set(r, q) for q in cfg.quantiles)))
    t0 = time.perf_counter()
    Gp_exact, Gp_approx = perturbation_grams(
        perts, params, widest if cfg.compat == "exact" else None, cfg.gram_memory_gb, progress, gram_cache, scheme
    )
    _add(timed, "gram", t0)
    stages = [stage1(r, q, b, Gp_exact, Gp_approx, cfg.merge_rules) for q in cfg.quantiles for b in cfg.betas]
    cands: dict[str, list[Candidate]] = {rule: [] for rule in cfg.merge_rules}
    bar = tqdm(
        total=len(cfg.merge_rules) * len(stages) * len(cfg.alphas),
        desc=f"step search ({probe})",
        unit="cand",
        disable=not progress,
        dynamic_ncols=True,
    )

    def counted(direction, split):
        out = score(direction, split)
        bar.update(1)
        return out

    todo = [(st, rule) for st in stages for rule in cfg.merge_rules]
    keep = perturber if project is None else None
    group = (
        max(1, int(cfg.merge_memory_gb * 2**30 // (4 * perturber.n_selected)))
        if keep is not None
        else max(1, len(todo))
    )
    for g in range(0, len(todo), group):
        t0 = time.perf_counter()
        keep_together(keep, [st.direction(perts, rule) for st, rule in todo[g : g + group]])
        _add(timed, "merge", t0)
        t0 = time.perf_counter()
        for st, rule in todo[g : g + group]:
            cands[rule] += search_step(
                st, perts, cfg.alphas, counted, probe, rule, centre, project, getattr(score, "prepare", None)
            )
        _add(timed, "step_search", t0)
        if keep is not None and (release or g + group < len(todo)):
            keep.release_merged()
    bar.close()
    return stages, cands, Gp_exact if Gp_exact is not None else Gp_approx


def consolidate_stage1(
    rewards: Sequence[float],
    seeds: Sequence[int],
    sigmas: Sequence[float],
    params: Sequence[tuple[str, torch.Size]],
    score: ScoreFn,
    cfg: OperatorConfig,
    *,
    probe: str = "probe",
    validation: str = "validation",
    progress: bool = True,
    project: Callable[[Direction], Direction] | None = None,
    gram_cache=None,
    scheme: str = SCHEME_VERSION,
    perturber: Perturber | None = None,
) -> ConsolidationResult:
    """Stage 1 end to end: weights for every (q, beta) and rule, step search on probe, gate on validation.

    Ties on the probe go to the earlier grid point (smaller q, beta, alpha), so the choice is
    deterministic. `scheme`: the noise scheme of the population (the Gram matrix regenerates its
    noise). `perturber`: the backend's, to build merged directions together (merge_and_search); the
    deployed rule's best M is still built on return (where it fits): the caller frees it
    (`perturber.release_merged()`) once it has applied it for the last time. The first of cfg.merge_rules is deployed (pass 2 by default); every other rule
    is searched and gated too, for the report. `project` (low-rank consolidation,
    corp/methods/consolidate/lowrank.py) replaces each m by its projection before the step search, so the
    probe and the gate judge what is deployed.
    """
    perts = [Direction.single(s, sg) for s, sg in zip(seeds, sigmas)]
    seconds: dict[str, float] = {}
    stages, cands, Gp = merge_and_search(
        rewards,
        perts,
        params,
        score,
        cfg,
        probe,
        None,
        progress,
        project,
        gram_cache,
        scheme,
        perturber,
        release=False,
        seconds=seconds,
    )
    bests = {rule: max(cs, key=lambda c: c.probe_score) for rule, cs in cands.items()}  # max keeps the first among ties
    deployed = cfg.merge_rules[0]
    best = bests[deployed]
    if perturber is not None:  # the step search's last group is still built: keep what the gates apply, free the rest
        fits = project is None and perturber.n_selected * 4 * len(bests) <= cfg.merge_memory_gb * 2**30
        wanted = [t for b in bests.values() for t in b.direction.components if isinstance(t, Merged)]
        perturber.release_merged(keep=wanted if fits else ())
        if fits:
            keep_together(perturber, [b.direction for b in bests.values()])  # builds only those not kept
    t0 = time.perf_counter()
    gates = {rule: gate_on(score, b.direction, None, validation, cfg.gate_z) for rule, b in bests.items()}
    if perturber is not None:  # the deployed rule's M stays built: its test row and the saved model apply it next
        perturber.release_merged(keep=[t for t in best.direction.components if isinstance(t, Merged)] if fits else ())
    _add(seconds, "gate", t0)
    gate = gates[deployed]
    table = [{"candidate": "base", "probe_score": mean_score(score(None, probe)), "pass": "base"}]
    for rule in reversed(cfg.merge_rules):  # pass 1 rows first, as the report always listed them
        table += [{"candidate": c.name, "probe_score": c.probe_score, **c.params} for c in cands[rule]]
    reason = f"stage 1 candidate '{best.name}' {gate.reason}"
    return ConsolidationResult(
        direction=best.direction if gate.accepted else Direction(),
        accepted=gate.accepted,
        gate=gate,
        best=best,
        probe_table=table,
        stage1=[st.to_dict(perts) for st in stages],
        pass1_gate=gates.get("pass1") if deployed != "pass1" else None,
        rounds=[],
        reason=reason if gate.accepted else reason + "; abstaining: the output is the base model",
        rule_gates=gates,
        perts=list(perts),
        gram=Gp,
        best_stage=next(st for st in stages if st.q == best.params["q"] and st.beta == best.params["beta"]),
        seconds=seconds,
    )
