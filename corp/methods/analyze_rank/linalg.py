"""Linear-algebra helpers of the split-half analysis.

Plain numerical building blocks, no statistics and no run directories: the top-q singular
triplets of a batch of matrices (exact for small sides, randomised otherwise) and the subspace
overlap of two bases. The best rank-r approximation of an update as LoRA factors
(`low_rank_factors`, `project_low_rank`), which low-rank consolidation uses too, is in the core
module `corp/algorithms/lowrank.py`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

EXACT_MAX = 160  # exact SVD (via the Gram matrix) when a matrix side is at most this


@contextmanager
def one_thread(threads: int = 1):
    """Run the block with `threads` torch threads, then restore the previous setting."""
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def top_svd(G: torch.Tensor, q: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-q singular triplets of a batch (k, m, n): U (k, m, q), S (k, q), V (k, n, q).

    Small matrices (a side <= EXACT_MAX): exact, from the eigendecomposition of the Gram matrix of
    the short side (batched eigh is much faster than batched SVD on CPU, and a Gaussian-like
    matrix is well conditioned). Bigger ones: torch.svd_lowrank (q columns, 2 power iterations)
    one matrix at a time; it draws its test matrix from torch's global generator, so callers that
    need reproducible results seed it."""
    m, n = G.shape[-2:]
    q = min(q, m, n)
    if min(m, n) <= EXACT_MAX:
        with one_thread():  # batched small LAPACK calls: 2 threads were ~15x slower than 1 here (spin-waits)
            return _gram_svd(G, q)
    outs = [torch.svd_lowrank(g, q=q, niter=2) for g in G]  # a loop is faster than a batch on CPU
    return tuple(torch.stack([o[j] for o in outs]) for j in range(3))  # type: ignore[return-value]


def _gram_svd(G: torch.Tensor, q: int):
    Gd = G.double()
    m, n = G.shape[-2:]
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


def subspace_overlap(U_A: torch.Tensor, U_B: torch.Tensor, r: int) -> float:
    """o_r = ||U_A[:, :r]^T U_B[:, :r]||_F^2 / r (1 = same subspace, r/m on average for random ones)."""
    M = U_A[:, :r].T @ U_B[:, :r]
    return float((M**2).sum() / r)
