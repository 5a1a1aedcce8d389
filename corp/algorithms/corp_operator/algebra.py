"""Direction algebra for CoRP (arXiv 2605.31494; docs/methods.md "CoRP"): the weight-space Gram
matrix of seeded perturbations, linear combinations of directions (plain and merged), the elite
set, the compatibility terms and the kernel PCA of the elite cloud. Exact linear algebra on seed
coefficients; nothing here evaluates a model.

Departure from the public code (a docs/methods.md must-have): the Gram matrix is exact in weight space
(fp64 over every selected tensor, noise regenerated tensor by tensor), with the seed-orthogonal
approximation (distinct seeds orthogonal, |eps|^2 = dim) beside it for comparison.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from corp.algorithms.perturb import SCHEME_VERSION, Component, Direction
from corp.algorithms.perturb.noise import NoiseStream, piece_bounds
from corp.algorithms.perturb.workers import Scratch, per_tensor


def gram_matrix(
    params: Sequence[tuple[str, torch.Size]],
    seeds: Sequence[int],
    memory_gb: float = 2.0,
    progress: bool = True,
    cache_dir=None,
    scheme: str = SCHEME_VERSION,
) -> np.ndarray:
    """G_ij = <eps(seed_i), eps(seed_j)> over all `params`, accumulated in fp64 (noise of `scheme`,
    the run's: a population scored under an older scheme keeps its meaning).

    Noise is regenerated tensor by tensor, tensors on parallel workers (`per_tensor`), each seed's noise
    drawn once, in column pieces that fit the memory budget (per worker; `_tensor_gram`).
    With `cache_dir`, the result is stored there keyed by (noise scheme, tensors, seeds), so a
    resumed run does not pay for it twice.
    """
    if cache_dir is not None:
        return _cached_gram(params, seeds, memory_gb, progress, cache_dir, scheme)
    k = len(seeds)
    G = torch.zeros((k, k), dtype=torch.float64)
    # The budget is per worker (each holds its own tensor's pieces) so that the pieces, and with them the
    # bits of G, do not depend on how many workers ran.
    budget = max(1, int(memory_gb * 2**30))

    def partial(name: str, shape, scratch: Scratch) -> tuple[str, torch.Tensor]:
        """This tensor's part of G, on a worker (its seeds' streams bring their own generators)."""
        return name, _tensor_gram(seeds, name, shape, budget, scheme, scratch.stop)

    parts = per_tensor(partial, [(name, torch.Size(shape)) for name, shape in params])
    _add_in_order(G, params, parts, progress)
    return G.numpy()


def _cached_gram(
    params: Sequence[tuple[str, torch.Size]],
    seeds: Sequence[int],
    memory_gb: float,
    progress: bool,
    cache_dir,
    scheme: str,
) -> np.ndarray:
    """`gram_matrix` through its file cache in `cache_dir`: computed once, written atomically."""
    key = hashlib.sha1(
        repr((scheme, [(n, tuple(s)) for n, s in params], [int(x) for x in seeds])).encode()
    ).hexdigest()[:16]
    path = Path(cache_dir) / f"gram-{key}.npy"
    if path.exists():
        return np.load(path)
    G = gram_matrix(params, seeds, memory_gb, progress, None, scheme)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, G)
    tmp.replace(path)
    return G


class Stopped(Exception):
    """A Gram part that ended early because its caller stopped (`Scratch.stop`): its result would be dropped."""


def _tensor_gram(
    seeds: Sequence[int],
    name: str,
    shape,
    budget: int,
    scheme: str,
    stop: threading.Event | None = None,
) -> torch.Tensor:
    """One tensor's part of G: every seed's noise drawn once, in column pieces (`gram_piece` elements, so a
    piece of all k seeds in fp32 and its fp64 copy fit the per-worker budget), each piece's k x k product
    added in fp64; ends with `Stopped` between two pieces once `stop` is set (its caller is gone: a stopped
    run need not wait for it). Before 2026-12-07 the seeds went in row blocks and each pair of blocks drew
    its noise again: the 1.5B model's two 233M-element matrices, at one row a block, drew each elite's
    noise about 47 times (3 hours a seed for 94 elites). G is the same sum in another order (fp64 rounding)."""
    k = len(seeds)
    bounds = piece_bounds(shape, gram_piece(k, budget), scheme)
    width = max(b - a for a, b in bounds)
    streams = [NoiseStream(s, name, shape, scheme) for s in seeds]
    S = torch.empty((k, width), dtype=torch.float32)
    D = torch.empty((k, width), dtype=torch.float64)
    part = torch.zeros((k, k), dtype=torch.float64)
    for a, b in bounds:
        if stop is not None and stop.is_set():
            raise Stopped(f"the Gram part of {name}: its caller stopped")
        for r, stream in enumerate(streams):
            stream.fill(S[r, : b - a], a, b)
        d = D[:, : b - a]
        d.copy_(S[:, : b - a])
        part += d @ d.T
    return part


def gram_piece(seeds: int, budget: int) -> int:
    """Elements per seed in one column piece of a tensor's Gram part: 1M, fewer where the piece of all `seeds`
    in fp32 and its fp64 copy (12 bytes an element) would pass the per-worker `budget`; at least 16 (torch's
    randn group). The row-block Gram summed over chunks of min(1M, budget / (32 k)) elements, so G keeps its
    bits where that was 1M too (k <= budget / 32 MiB: 64 seeds at 2 GiB), one block held every seed, and no
    remainder under 16 joins a piece; elsewhere it is the same sum in another order."""
    return max(16, min(1 << 20, budget // (12 * max(1, seeds))))


def _add_in_order(G: torch.Tensor, params: Sequence[tuple[str, torch.Size]], parts, progress: bool) -> None:
    """Add the tensors' parts (arriving in any order from the workers) to G in `params` order, so G
    has the same bits whatever the number of workers."""
    position = {name: i for i, (name, _) in enumerate(params)}
    waiting: dict[int, torch.Tensor] = {}
    added = 0
    bar = tqdm(total=len(params), desc="gram (exact compat)", unit="tensor", disable=not progress, dynamic_ncols=True)
    for name, part in parts:
        waiting[position[name]] = part
        while added in waiting:
            G += waiting.pop(added)
            added += 1
        bar.update(1)
    bar.close()


def softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max()
    e = np.exp(z)
    return e / e.sum()


def combine(perts: Sequence[Direction], weights: Sequence[float]) -> Direction:
    """sum_j w_j p_j as one Direction of plain components; components with the same (seed, sigma)
    are merged, in order of first appearance."""
    acc: dict[tuple[int, float], float] = {}
    for p, w in zip(perts, weights):
        for c in p.seed_components():
            key = (c.seed, c.sigma)
            acc[key] = acc.get(key, 0.0) + float(w) * c.coef
    return Direction([Component(s, sg, cf) for (s, sg), cf in acc.items() if cf != 0.0])


def merge(perts: Sequence[Direction], weights: Sequence[float]) -> Direction:
    """sum_j w_j p_j as one merged term (`Direction.merged`): the coefficients of `combine`,
    materialised once as M and scaled per step size (alpha M), in the step search and in
    `corp apply` alike, so the recipe rebuilds exactly the weights that were evaluated."""
    return Direction.merged(combine(perts, weights).components)


def seed_basis(perts: Sequence[Direction]) -> tuple[list[int], np.ndarray]:
    """Write each perturbation as p_j = sum_b C[j, b] eps(seed_b): the seed basis and C (sigma absorbed)."""
    seeds: list[int] = []
    index: dict[int, int] = {}
    for p in perts:
        for c in p.seed_components():
            if c.seed not in index:
                index[c.seed] = len(seeds)
                seeds.append(c.seed)
    C = np.zeros((len(perts), len(seeds)))
    for j, p in enumerate(perts):
        for c in p.seed_components():
            C[j, index[c.seed]] += c.coef * c.sigma
    return seeds, C


def elite_set(rewards: np.ndarray, q: float) -> list[int]:
    """E = {i : r_i >= quantile_q(r)}, in population order."""
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


def perturbation_grams(
    perts: Sequence[Direction],
    params,
    exact_for: Sequence[int] | None,
    memory_gb: float,
    progress: bool,
    cache_dir=None,
    scheme: str = SCHEME_VERSION,
) -> tuple[np.ndarray | None, np.ndarray]:
    """(exact Gram or None, seed-orthogonal Gram) of the perturbations; the exact one only over
    `exact_for` (the widest elite set), the rest left zero (never read)."""
    dim = int(sum(int(np.prod(s)) for _, s in params))
    seeds, C = seed_basis(perts)
    approx = dim * (C @ C.T)
    if exact_for is None:
        return None, approx
    idx = list(exact_for)
    cols = sorted({b for j in idx for b in np.nonzero(C[j])[0]})
    G_seed = gram_matrix(params, [seeds[b] for b in cols], memory_gb, progress, cache_dir, scheme)
    Csub = C[np.ix_(idx, cols)]
    exact = np.zeros_like(approx)
    exact[np.ix_(idx, idx)] = Csub @ G_seed @ Csub.T
    return exact, approx


def principal_directions(elite: Sequence[int], perts: Sequence[Direction], Gp: np.ndarray, k: int) -> list[Direction]:
    """Top-k unit-norm principal directions of the elite cloud {p_i}, as seed combinations.

    Kernel PCA: with centred Gram K = H Gp H (H = I - 11^T/n), eigenpairs (lambda, v) give the unit
    direction u = sum_j v_j p_j / sqrt(lambda) (v is orthogonal to 1, so centring drops out).
    """
    E = list(elite)
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
