"""Low-rank consolidation and LoRA export (`corp consolidate --low-rank off|auto|R --export-lora`).

What it implements: docs/methods.md, "Low-rank consolidation (ours)". This is OUR addition, not the
CoRP paper's (arXiv 2605.31494 reports low-rank structure but publishes no low-rank consolidation).
Per (q, beta) stage, the merged update m2 (and m1, so the pass-1 report compares like with like)
is materialised matrix by matrix and each selected matrix's block is replaced by its best rank-r
approximation B @ A (exact SVD, `corp.algorithms.lowrank.low_rank_factors`). The projection is
linear in the step, P(alpha m) = alpha P(m), so the factors are computed once per m and the step
search only scales them; the probe search and the validation gate then see the projected
candidates, exactly as they see full-rank ones.
`LowRankDirection`, its factors file (`write_factors`, `load_factors`), the SVD helper
`low_rank_factors` and `reproducible_ranks` are in `corp/algorithms/lowrank.py`, the core module the recipe
and the analysis share; this module is consolidation's own: which ranks, the projector, the PEFT
export, the exact LoRA of a low-rank population and its compression.

Choices and departures, each for a reason:
- `auto`: r per matrix is the reproducible rank r* of `corp analyze-rank`. A matrix with r* = 0,
  and every parameter the analysis did not cover (1-D norms and biases, the vocabulary matrices it
  skips), gets NO update, so the deployed update is exactly a LoRA adapter. An integer R gives every
  selected 2-D matrix its rank-min(R, m, n) projection and 1-D parameters none.
- Stage 2 (re-centring) stays full-rank: its centres are sums of seed combinations, so
  `--stage2-rounds > 0` with `--low-rank` is refused rather than silently mixed (a LowRankDirection cannot
  be added to another direction).
- Materialisation: `add_to` adds round_fp32(scale * (B @ A computed in fp64)) to the fp32 target.
  Computing the product in fp64 makes the rounded fp32 bits independent of BLAS kernel and thread
  count (the K dimension is r), so `corp apply` rebuilds the saved model bit-exactly from the
  factors file, like it does from seeds.
- The factors are not reproducible from seeds alone without redoing the SVD, so a low-rank recipe
  carries them in `lowrank_factors.safetensors` (unit scale), pinned by its sha256.
- Export: a PEFT LoRA adapter per factored matrix, lora_B = B, lora_A = A (embeddings:
  lora_embedding_A = B^T, lora_embedding_B = A^T), with per-module `rank_pattern` r_i and
  `alpha_pattern` scale * r_i so that PEFT's lora_alpha / r equals the deployed scale. A matrix
  whose tensor is tied to another module (tied embeddings and lm_head) gets the same adapter on
  every module that shares it, as the merged model does (PEFT warns about tied layers; do not
  `merge_and_unload` such an adapter into a tied model, which would add the delta twice). vLLM's
  LoRA loader may not honour rank_pattern/alpha_pattern; PEFT does.

Exact LoRA of a low-rank population (`--noise lowrank:r=R --export-lora` with `--low-rank off`):
every specialist's noise is E_k = A_k B_k^T / sqrt(R) per matrix (corp.algorithms.perturb.lowrank_noise) and
1-D parameters get none, so CoRP's update sum_k c_k E_k (c_k = coef_k sigma_k, merged terms'
scales folded in, components of one seed summed) IS a rank <= K*R update of the 2-D matrices and
nothing else. `exact_lora` writes it as a LowRankDirection at unit scale with B = [c_1 A_1 / sqrt(R)
| ... | c_K A_K / sqrt(R)] (m x KR) and A = [B_1 | ... | B_K]^T (KR x n): no SVD, no truncation,
and export_lora's layout, rank_pattern/alpha_pattern and tied-module handling unchanged. The saved
model stays the reference (W0 + the dense E of the scheme, through the Perturber, like `corp
apply`); the adapter equals it up to fp32 rounding (different summation order, not bits).
`compress` gives the best rank-r approximation of such a factored update from QRs of the two
factors and an SVD of a (KR x KR) core, with its relative Frobenius error, without forming m x n.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from corp.algorithms.lowrank import LowRankDirection, low_rank_factors, reproducible_ranks
from corp.algorithms.perturb import Direction
from corp.algorithms.perturb.lowrank_noise import factors as noise_factors
from corp.algorithms.perturb.lowrank_noise import lowrank_rank
from corp.errors import CorpError
from corp.extras import require


def parse_low_rank(value) -> str:
    """'off', 'auto' or a positive integer (as a string); anything else is a one-line error."""
    text = str(value if value is not None else "off").strip().lower()
    if text in ("off", "auto"):
        return text
    try:
        r = int(text)
    except ValueError:
        raise CorpError(f"--low-rank must be 'off', 'auto' or a positive integer rank, got '{value}'") from None
    if r < 1:
        raise CorpError(f"--low-rank rank must be >= 1, got {r}")
    return str(r)


# ---------------------------------------------------------------- which ranks


def resolve_ranks(
    mode: str,
    params: Sequence[tuple[str, Sequence[int]]],
    analysed: dict[str, int] | None = None,
    rank_dir: str | Path | None = None,
) -> dict[str, int]:
    """{name: r} for every selected 2-D parameter that gets a low-rank update (r may be 0 in auto)."""
    shapes = {n: tuple(s) for n, s in params}
    if mode == "auto":
        if analysed is None:
            raise CorpError("--low-rank auto needs the ranks of `corp analyze-rank`")
        covered = {n: r for n, r in analysed.items() if n in shapes and len(shapes[n]) == 2}
        if not covered:
            raise CorpError(
                f"the rank analysis in '{rank_dir}' covers none of this run's "
                "perturbed matrices (different model or --include/--exclude?)"
            )
        missing = sorted(set(analysed) - set(covered))
        if missing:
            warnings.warn(
                f"{len(missing)} analysed matrice(s) are not perturbed in this run and get no update, e.g. {missing[0]}"
            )
        return {n: max(0, min(int(r), *shapes[n])) for n, r in covered.items()}
    R = int(mode)
    return {n: min(R, *s) for n, s in shapes.items() if len(s) == 2}


def read_analysis(rank_dir: str | Path) -> dict[str, int]:
    if not Path(rank_dir).is_dir():
        raise CorpError(f"--rank-from '{rank_dir}' is not a directory")
    return reproducible_ranks(rank_dir)


class LowRankProjector:
    """m -> its projection, matrix by matrix, at unit scale; cached per m (components)."""

    def __init__(self, ranks: dict[str, int], params: Sequence[tuple[str, Sequence[int]]], progress: bool = False):
        self.ranks = dict(ranks)
        self.shapes = {n: tuple(s) for n, s in params}
        self.progress = progress
        self._cache: dict[tuple, LowRankDirection] = {}

    def __call__(self, m: Direction) -> LowRankDirection:
        from tqdm.auto import tqdm

        if isinstance(m, LowRankDirection):
            raise CorpError("direction is already low-rank")
        key = tuple(m.components)
        if key not in self._cache:
            gen = torch.Generator(device="cpu")
            factors = {}
            todo = [(n, r) for n, r in self.ranks.items() if r > 0]
            for name, r in tqdm(
                todo, desc="low-rank projection", unit="matrix", disable=not self.progress, dynamic_ncols=True
            ):
                factors[name] = low_rank_factors(m.delta(name, self.shapes[name], gen), r)
            self._cache[key] = LowRankDirection(factors, 1.0, m.components)
        return self._cache[key]

    def summary(self, n_selected: int) -> dict:
        lora = sum(r * (self.shapes[n][0] + self.shapes[n][1]) for n, r in self.ranks.items())
        n2d = sum(1 for s in self.shapes.values() if len(s) == 2)
        return {
            "matrices_with_rank": sum(1 for r in self.ranks.values() if r > 0),
            "matrices_analysed": len(self.ranks),
            "matrices_2d": n2d,
            "lora_parameters": int(lora),
            "full_parameters": int(n_selected),
            "ranks": dict(sorted(self.ranks.items())),
        }


# ---------------------------------------------------------------- PEFT LoRA export


def export_lora(
    direction: LowRankDirection, model: torch.nn.Module, out_dir: str | Path, base_model: str | None = None
) -> Path:
    """Write a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) equal to `direction`."""

    LoraConfig = require("peft", "--export-lora").LoraConfig
    from safetensors.torch import save_file

    if not direction.factors:
        raise CorpError(
            "the low-rank update has no factored matrix (every rank is 0); there is no LoRA adapter to export"
        )
    all_params = list(model.named_parameters(remove_duplicate=False))
    modules = dict(model.named_modules())
    tensors: dict[str, torch.Tensor] = {}
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    for name in sorted(direction.factors):
        B, A = direction.factors[name]
        param = dict(all_params).get(name)
        if param is None:
            raise CorpError(f"cannot export '{name}': the model has no such parameter")
        for alias in [n for n, p in all_params if p is param]:
            mod_name, _, leaf = alias.rpartition(".")
            mod = modules.get(mod_name)
            prefix = f"base_model.model.{mod_name}"
            if leaf == "weight" and isinstance(mod, torch.nn.Linear):
                tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"] = A.clone(), B.clone()
            elif leaf == "weight" and isinstance(mod, torch.nn.Embedding):
                # PEFT: delta = (lora_embedding_B @ lora_embedding_A)^T, so A_e = B^T and B_e = A^T
                tensors[f"{prefix}.lora_embedding_A"], tensors[f"{prefix}.lora_embedding_B"] = (
                    B.T.contiguous(),
                    A.T.contiguous(),
                )
            else:
                raise CorpError(
                    f"cannot export '{alias}' as LoRA: it is the '{leaf}' of a "
                    f"{type(mod).__name__}, not the weight of a Linear or Embedding"
                )
            r = int(B.shape[1])
            rank_pattern[mod_name], alpha_pattern[mod_name] = r, direction.scale * r
    r_max = max(rank_pattern.values())
    cfg = LoraConfig(
        r=r_max,
        lora_alpha=direction.scale * r_max,
        target_modules=sorted(rank_pattern),
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    tmp = out / "adapter_model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "adapter_model.safetensors")
    return out


# ---------------------------------------------------------------- exact LoRA of a low-rank population


def exact_lora(direction: Direction, params: Sequence[tuple[str, Sequence[int]]], scheme: str) -> LowRankDirection:
    """`direction` (seed components, merged terms allowed) under low-rank `scheme` as an exact
    LowRankDirection at unit scale: rank (distinct seeds with a nonzero coefficient) * R per 2-D
    parameter of `params`, 1-D parameters none (they get no noise under the scheme)."""
    R = lowrank_rank(scheme)
    if R is None:
        raise CorpError(f"an exact LoRA needs a low-rank population (--noise lowrank:r=R), not noise scheme {scheme}")
    if isinstance(direction, LowRankDirection):
        raise CorpError("direction is already low-rank (a projection); export it with export_lora")
    coefs: dict[int, float] = {}  # seed -> sum of coef * sigma: the noise depends on the seed only
    for c in direction.seed_components():
        coefs[c.seed] = coefs.get(c.seed, 0.0) + c.coef * c.sigma
    elites = [(seed, c) for seed, c in coefs.items() if c != 0.0]
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    if elites:
        gen = torch.Generator(device="cpu")
        s = 1.0 / math.sqrt(R)
        for name, shape in params:
            if len(tuple(shape)) != 2:
                continue
            Bs, As = [], []
            for seed, c in elites:
                A_k, B_k = noise_factors(seed, name, tuple(shape), scheme, gen)  # A_k (m x R), B_k (n x R)
                Bs.append(A_k.mul_(c * s))
                As.append(B_k.t())
            out[name] = (torch.cat(Bs, 1), torch.cat(As, 0))
    return LowRankDirection(out, 1.0, direction.seed_components())


def compress(direction: LowRankDirection, rank: int) -> tuple[LowRankDirection, dict]:
    """The best rank-min(rank, r_i) approximation of each factored matrix (unit scale, the
    direction's scale folded in) and {"rank" (the largest rank written), "relative_frobenius_error"
    (over all matrices), "per_matrix" {name: error}, and "requested_rank" when `rank` is above every r_i}: ||D - D_r||_F / ||D||_F from the singular values of the core."""
    if rank < 1:
        raise CorpError(f"--lora-r must be >= 1, got {rank}")
    out, per, tail_all, total_all, used = {}, {}, 0.0, 0.0, 0
    for name, (B, A) in direction.factors.items():
        Qb, Rb = torch.linalg.qr(B.double() * direction.scale)  # m x k, k x k
        Qa, Ra = torch.linalg.qr(A.double().t())  # n x k, k x k
        U, S, Vh = torch.linalg.svd(Rb @ Ra.t())
        r = min(rank, int(S.numel()))
        used = max(used, r)
        out[name] = ((Qb @ U[:, :r] * S[:r]).float(), (Vh[:r] @ Qa.t()).float())
        total, tail = float((S**2).sum()), float((S[r:] ** 2).sum())
        per[name] = math.sqrt(tail / total) if total > 0 else 0.0
        tail_all, total_all = tail_all + tail, total_all + total
    err = math.sqrt(tail_all / total_all) if total_all > 0 else 0.0
    # the rank the adapter has: a `rank` above every matrix's own is not what was written
    report = {"rank": used, "relative_frobenius_error": err, "per_matrix": per}
    if used < rank:
        report["requested_rank"] = int(rank)
    return LowRankDirection(out, 1.0, direction.components), report
