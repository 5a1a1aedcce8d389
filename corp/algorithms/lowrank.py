"""Low-rank factors, shared by the split-half analysis, low-rank consolidation and the recipe.

What lives here is what more than one part of corp reads or writes, so that no algorithm package
imports another (docs/architecture.md, "Layers"):
- `low_rank_factors` / `project_low_rank`: the best rank-r approximation of an update (Eckart-Young,
  exact SVD) as LoRA factors B @ A; low-rank consolidation (`corp/methods/consolidate/lowrank.py`) projects
  its merged updates with them.
- `reproducible_ranks`: the r* table `corp analyze-rank` writes (rank_summary.json, else
  rank_analysis.csv), which `--low-rank auto` reads.
- `LowRankDirection` (scale * B @ A on the factored matrices) and its factors file
  (`write_factors` / `load_factors`, `lowrank_factors.safetensors` pinned by its sha256): a
  low-rank recipe (`corp/algorithms/recipe.py`) is rebuilt from them. Why the product is computed in fp64 and
  why the factors travel in a file: `corp/methods/consolidate/lowrank.py`'s docstring.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch

from corp.algorithms.perturb import Component, Direction
from corp.errors import CorpError
from corp.runtime.runs import read_json

FACTORS_FILE = "lowrank_factors.safetensors"
_ROW_BLOCK = 4096  # rows of B @ A materialised at a time (bounds the fp64 temporary)


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


def project_low_rank(update: torch.Tensor, r: int) -> torch.Tensor:
    """Best rank-r approximation of a 2-D update (Eckart-Young, exact SVD), same dtype and shape."""
    B, A = low_rank_factors(update, r)
    return (B @ A).to(update.dtype)


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
    raise CorpError(
        f"'{run_dir}' has no rank_summary.json or rank_analysis.csv; run `corp analyze-rank --from-run {run_dir}` first"
    )


class LowRankDirection(Direction):
    """scale * B @ A on the factored matrices, nothing elsewhere.

    `factors` maps canonical parameter names to (B (m x r), A (r x n)) at unit scale; `components`
    records the full-rank direction the factors were projected from (already scaled), for reports
    and recipes only: they are never materialised.
    """

    prefixable = False  # Perturber.cache_prefix works on seed components; these are not that

    def __init__(
        self,
        factors: dict[str, tuple[torch.Tensor, torch.Tensor]],
        scale: float = 1.0,
        components: Sequence[Component] = (),
        _digest: str | None = None,
    ):
        super().__init__(list(components))
        self.factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, (B, A) in factors.items():
            if B.dim() != 2 or A.dim() != 2 or B.shape[1] != A.shape[0]:
                raise CorpError(
                    f"low-rank factors of '{name}' have shapes {tuple(B.shape)} "
                    f"and {tuple(A.shape)}; need B (m x r) and A (r x n)"
                )
            if B.shape[1] > 0:
                self.factors[name] = (
                    B.detach().to(torch.float32).contiguous(),
                    A.detach().to(torch.float32).contiguous(),
                )
        self.scale = float(scale)
        self._digest = _digest

    @property
    def ranks(self) -> dict[str, int]:
        return {n: int(B.shape[1]) for n, (B, _) in self.factors.items()}

    def digest(self) -> str:
        """sha256 of the unit-scale factors (names, shapes, bytes): identifies the low-rank update."""
        if self._digest is None:
            h = hashlib.sha256()
            for name in sorted(self.factors):
                for t in self.factors[name]:
                    h.update(name.encode())
                    h.update(str(tuple(t.shape)).encode())
                    h.update(t.numpy().tobytes())
            self._digest = h.hexdigest()
        return self._digest

    def scaled(self, alpha: float) -> LowRankDirection:
        comps = Direction(self.components).scaled(alpha).components  # plain or merged source terms
        return LowRankDirection(self.factors, self.scale * alpha, comps, self._digest)

    def __add__(self, other):
        raise CorpError(
            "a low-rank direction cannot be added to another direction (stage "
            "2 re-centring is full-rank; use --stage2-rounds 0 with --low-rank)"
        )

    __radd__ = __add__

    def to_json(self) -> list[dict]:
        """A list whose first entry pins the factors and scale, so caches keyed by it tell low-rank
        candidates from full-rank ones with the same components."""
        return [{"low_rank": {"factors_sha256": self.digest(), "scale": self.scale}}] + super().to_json()

    def is_zero(self) -> bool:
        return not self.factors or self.scale == 0.0

    def add_to(
        self,
        target: torch.Tensor,
        name: str,
        generator: torch.Generator | None = None,
        buffer: torch.Tensor | None = None,
        scheme: str | None = None,
    ) -> torch.Tensor:
        """target += round_fp32(scale * (B @ A in fp64)) if `name` is factored; else nothing
        (`scheme` is ignored: the factors hold no seeded noise)."""
        f = self.factors.get(name)
        if f is None or self.scale == 0.0:
            return target
        B, A = f
        if tuple(target.shape) != (B.shape[0], A.shape[1]):
            raise CorpError(
                f"low-rank factors of '{name}' give shape "
                f"{(B.shape[0], A.shape[1])}, the parameter has {tuple(target.shape)}"
            )
        A64 = A.double()
        for i in range(0, B.shape[0], _ROW_BLOCK):
            target[i : i + _ROW_BLOCK].add_((B[i : i + _ROW_BLOCK].double() @ A64).mul_(self.scale).to(torch.float32))
        return target

    def lora_parameters(self) -> int:
        return sum(int(B.numel() + A.numel()) for B, A in self.factors.values())


# ---------------------------------------------------------------- factors file (recipe)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def factors_file(direction: LowRankDirection) -> tuple[dict, bytes]:
    """The factors file of `direction` (unit-scale factors, safetensors) as bytes, and the recipe's
    low_rank entry that pins them (the run's driver writes the bytes to `FACTORS_FILE`)."""
    from safetensors.torch import save

    tensors = {}
    for name in sorted(direction.factors):
        B, A = direction.factors[name]
        tensors[f"{name}.B"], tensors[f"{name}.A"] = B, A
    data = save(tensors, metadata={"format": "pt", "corp": "lowrank-factors-v1"})
    entry = {
        "factors_file": FACTORS_FILE,
        "factors_sha256": hashlib.sha256(data).hexdigest(),
        "scale": direction.scale,
        "ranks": dict(sorted(direction.ranks.items())),
        "projected_from": Direction(direction.components).to_json(),
    }
    return entry, data


def write_factors(direction: LowRankDirection, out_dir: str | Path) -> dict:
    """Unit-scale factors to out_dir/lowrank_factors.safetensors; returns the recipe's low_rank entry."""
    entry, data = factors_file(direction)
    path = Path(out_dir) / FACTORS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return entry


def load_factors(recipe_dir: str | Path, entry: dict) -> LowRankDirection:
    """The recipe's low-rank direction; a missing or altered factors file is a one-line error."""
    from safetensors.torch import load_file

    try:
        path = Path(recipe_dir) / entry["factors_file"]
        want_sha, scale, ranks = entry["factors_sha256"], float(entry["scale"]), entry["ranks"]
    except (KeyError, TypeError, ValueError):
        raise CorpError(
            "recipe's low_rank entry is incomplete (needs factors_file, factors_sha256, scale, ranks)"
        ) from None
    if not path.exists():
        raise CorpError(
            f"low-rank recipe needs its factors file '{path}', which is missing (copy it beside recipe.json)"
        )
    found = _sha256_file(path)
    if found != want_sha:
        raise CorpError(
            f"low-rank factors file '{path}' has sha256 {found[:12]}..., the recipe "
            f"expects {want_sha[:12]}...; it is not the file this recipe was made with"
        )
    raw = load_file(str(path))
    factors = {}
    for name, r in ranks.items():
        B, A = raw.get(f"{name}.B"), raw.get(f"{name}.A")
        if B is None or A is None or B.shape[1] != int(r):
            raise CorpError(f"low-rank factors file '{path}' lacks rank-{r} factors for '{name}'")
        factors[name] = (B, A)
    comps = Direction.from_json(entry.get("projected_from", [])).components
    return LowRankDirection(factors, scale, comps)
