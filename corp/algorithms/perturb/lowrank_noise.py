"""Low-rank noise: a specialist's noise for each weight matrix has rank r (EGGROLL, arXiv 2511.16652).

Scheme `corp-lowrank-v1:r=R` (`--noise lowrank:r=R`; `--noise full` is `corp-noise-v2`). A
specialist is still (seed, sigma). For a 2-D tensor W (m x n) named `name`, one CPU generator is
seeded from the key of (scheme, seed, name) exactly as `corp-noise-v2` seeds it (128-bit blake2b
key, SHAKE-128 Mersenne Twister state; the scheme string, rank included, is hashed into the key, so
ranks never share factors), and draws A (m x R) then B (n x R), standard normal fp32. The noise is

    E = (sum_k A[:, k] B[:, k]^T) * (1 / sqrt(R))      (the product is not scaled when R = 1)

built element by element (outer products accumulated in k order, then one scaling), never by a
matrix multiply, whose bits could depend on the BLAS kernel or the thread count: `noise()` under
this scheme returns the same bits in a worker thread and in the main thread, so every
materialisation path (Perturber apply, merged directions of a step search, Gram matrix,
analyze-rank, recipes and `corp apply`) is the one for full-rank noise with E in place of eps.
Each entry of E has unit variance and E has the Frobenius norm of full-rank noise in expectation.
A merged term's M (a step search's sum_k c_k E_k) is built by `merged_noise` a row block at a time
from the elites' factors, with the bits of adding each dense E whole (tested), so no elite's E is
held whole; it is still m x n work per elite and rank (not (m + n) K R), since the weights are.
On the hf backend CoRP does not take this path for its step search, gates and test row: it scores
each merged direction as its stacked factors (rank K R, corp.runtime.backends.batched_lowrank) and
materialises only the saved model; the dense build stays the reference and the path elsewhere.

What gets noise (choices, stated):
- 2-D tensors (every linear weight) get rank-R noise.
- The embedding is a 2-D tensor and gets rank-R noise like any matrix: E[token] = A[token] B^T /
  sqrt(R). Keeping it means `--include/--exclude` select the same tensors under both schemes, so a
  population differs from a full-rank one only in its noise; the factored pass handles it cheaply
  (a lookup of A's rows). With tied embeddings the lm_head is the same tensor, so it gets the same
  E (the factored pass adds sigma (h B) A^T / sqrt(R) to the logits). EGGROLL perturbs linear layers
  only; `--exclude embed_tokens` gives that.
- 1-D tensors (norm weights, biases) get no noise (zeros): a vector has no low-rank structure to
  exploit, and noising them would need per-row norms and biases in the factored pass. EGGROLL also
  leaves them alone. They stay selected (zeros are added), so a recipe's filter means the same.
- Tensors of more than 2 dimensions are refused (none in the decoder models corp supports).
Where this departs from EGGROLL: no antithetic pairs (a specialist is one (seed, sigma), as under
full-rank noise, so populations, recipes and merge rules are unchanged), the embedding is perturbed
by default (above), and the factors come from corp's per-tensor key like full-rank noise (one
tensor's factors can be regenerated alone).
A rank <= 0 or larger than a selected matrix's smaller side is refused in one line before anything
is scored (`check_shapes`, called when a Perturber is built).

The reference computation is this dense E: `corp apply` of a recipe and the materialised
one-at-a-time scoring path use it; the batched factored pass
(`corp.runtime.backends.batched_lowrank`) equals it up to floating-point rounding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import torch

from corp.algorithms.perturb.seeding import (  # noqa: F401
    LOWRANK_VERSION,
    SCHEME_VERSION,
    SCHEMES,
    lowrank_rank,
    lowrank_scheme,
    noise_key,
    parse_rank,
    seed_generator,
)
from corp.errors import CorpError

FULL_FLAG = "full"
_FLAG = re.compile(r"^(?:lowrank|low-rank)(?::r=(.*))?$")
_BLOCK = 1 << 16  # elements per block of E built at once: a block stays in cache while its R outer products accumulate


def scheme_from_flag(flag: str | None) -> str:
    """The scheme string of a `--noise` value: full (the current full-rank scheme), lowrank:r=R, or
    a scheme string itself."""

    flag = (flag or FULL_FLAG).strip()
    if flag == FULL_FLAG:
        return SCHEME_VERSION
    if flag in SCHEMES:
        return flag
    m = _FLAG.match(flag)
    if m is not None:
        if m.group(1) is None:
            raise CorpError(f"--noise '{flag}' names no rank; use e.g. lowrank:r=4")
        return lowrank_scheme(parse_rank(m.group(1), "--noise"))
    if lowrank_rank(flag, "--noise") is not None:
        return flag
    raise CorpError(f"unknown --noise '{flag}'; choose full or lowrank:r=R (R >= 1)")


def check_shapes(scheme: str, shapes: Iterable[tuple[str, torch.Size | tuple[int, ...]]]) -> None:
    """Refuse, in one line, a low-rank scheme whose rank exceeds a selected matrix's smaller side or
    a selected tensor of more than 2 dimensions; nothing for other schemes."""
    rank = lowrank_rank(scheme)
    if rank is None:
        return
    for name, shape in shapes:
        if len(shape) > 2:
            raise CorpError(
                f"noise scheme {scheme}: parameter '{name}' has {len(shape)} dimensions {tuple(shape)}; low-rank noise "
                "handles matrices and vectors only (exclude it with --exclude)"
            )
        if len(shape) == 2 and rank > min(shape):
            raise CorpError(
                f"noise scheme {scheme}: rank {rank} is larger than the smaller side of '{name}' {tuple(shape)}; use r "
                f"<= {min(shape)} or exclude it with --exclude"
            )


def factors(
    seed: int, name: str, shape, scheme: str, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(A (m x R), B (n x R)) fp32 CPU of 2-D tensor `name` of specialist `seed`; None for a 1-D tensor
    (no noise)."""

    rank = lowrank_rank(scheme)
    if rank is None:
        raise CorpError(f"factors: '{scheme}' is not a low-rank noise scheme")
    shape = tuple(shape)
    if len(shape) < 2:
        return None
    check_shapes(scheme, [(name, shape)])
    m, n = shape
    gen = seed_generator(generator or torch.Generator(device="cpu"), noise_key(seed, name, scheme), scheme)
    A = torch.randn((m, rank), generator=gen, dtype=torch.float32)
    B = torch.randn((n, rank), generator=gen, dtype=torch.float32)
    return A, B


def scale(scheme: str) -> float:
    """1 / sqrt(R): the factor E's product is multiplied by (the factored pass folds it into sigma)."""
    return 1.0 / math.sqrt(lowrank_rank(scheme))


def dense(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """E = (sum_k A[:, k] B[:, k]^T) / sqrt(R), fp32, element by element (module docstring)."""
    m, rank = A.shape
    n = B.shape[0]
    E = out if out is not None else torch.empty((m, n), dtype=torch.float32)
    Bt = B.t().contiguous()
    s = 1.0 / math.sqrt(rank)
    step = max(1, _BLOCK // max(n, 1))
    for i in range(0, m, step):
        blk, a = E[i : i + step], A[i : i + step]
        torch.mul(a[:, 0:1], Bt[0], out=blk)
        for k in range(1, rank):
            blk.addcmul_(a[:, k : k + 1], Bt[k])
        if rank > 1:
            blk.mul_(s)
    return E


def lowrank_noise(
    seed: int, name: str, shape, scheme: str, generator: torch.Generator | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The dense noise of tensor `name` of specialist `seed` under low-rank `scheme` (zeros for a 1-D
    tensor): what `corp.algorithms.perturb.noise.noise` returns under this scheme."""
    shape = tuple(shape)
    f = factors(seed, name, shape, scheme, generator)
    if f is None:
        return out.zero_() if out is not None else torch.zeros(shape, dtype=torch.float32)
    return dense(*f, out=out)


def merged_noise(
    terms: Sequence[tuple[int, Sequence[tuple[int, float]]]],
    n_out: int,
    name: str,
    shape,
    scheme: str,
    generator: torch.Generator | None = None,
) -> list[torch.Tensor]:
    """M_j = sum, over `terms` in order, of round(E(seed)[name] * f) for each (j, f) of the term,
    starting from zeros (fp32, j < n_out): the bits of building each seed's dense E whole and adding
    it (Perturber.keep_merged, materialise), built row block by row block instead, with dense()'s
    own row partition so each block's E comes from the same calls. A seed's dense E is never held
    whole: only its factors ((m + n) R numbers) are, and each block of E is added while in cache,
    so a merged low-rank direction costs R + 2 passes over cached blocks per elite, not three passes
    over the whole m x n tensor. 1-D tensors: zeros (no noise under this scheme)."""
    shape = tuple(shape)
    Ms = [torch.zeros(shape, dtype=torch.float32) for _ in range(n_out)]
    if len(shape) < 2:
        check_shapes(scheme, [(name, shape)])
        return Ms
    gen = generator or torch.Generator(device="cpu")
    drawn = [(factors(seed, name, shape, scheme, gen), uses) for seed, uses in terms if uses]
    m, n = shape
    step = max(1, _BLOCK // max(n, 1))
    E = torch.empty(step * n, dtype=torch.float32)
    tmp = torch.empty(step * n, dtype=torch.float32)
    for i in range(0, m, step):
        rows = min(step, m - i)
        blk, scaled = E[: rows * n].view(rows, n), tmp[: rows * n].view(rows, n)
        for (A, B), uses in drawn:
            dense(A[i : i + rows], B, out=blk)
            for j, f in uses:
                Ms[j][i : i + rows].add_(torch.mul(blk, f, out=scaled))
    return Ms
