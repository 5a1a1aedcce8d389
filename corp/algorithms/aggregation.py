"""Aggregation rules for federated rounds: FGRPO's relative-gain softmax and FedAvg. In the core
because more than one method uses them (`corp fgrpo`, and `corp fedcorp`'s reward combination,
`corp/methods/fedcorp/combine.py`, weights clients by FedAvg's data sizes).

FGRPO (arXiv 2606.03094) — reconstruction from the abstract and secondary notes (docs/methods.md,
"FGRPO"): the paper's exact formula is not public. Ours: client k's baseline b_k is an EMA (decay
0.9) of its own past round rewards; relative gain g_k = (R_k - b_k) / (|b_k| + eps); weights
alpha_k = softmax(g_k / tau). Departure: in a client's first round there is no history, so its
gain is 0 (b_k starts at R_k); the paper's initialisation is not known.
FedAvg (McMahan et al., arXiv 1602.05629): weights proportional to each client's data size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from corp.errors import CorpError

EPS = 1e-8


def relative_gains(rewards: Sequence[float], baselines: Sequence[float | None], eps: float = EPS) -> list[float]:
    """g_k = (R_k - b_k) / (|b_k| + eps); a client without a baseline yet (None) has gain 0."""
    return [0.0 if b is None else (r - b) / (abs(b) + eps) for r, b in zip(rewards, baselines)]


def softmax_weights(scores: Sequence[float], tau: float) -> list[float]:
    """softmax(scores / tau), max-subtracted so large gains cannot overflow."""
    if not tau > 0:
        raise CorpError(f"--tau must be > 0, got {tau}")
    if not scores:
        return []
    z = [s / tau for s in scores]
    top = max(z)
    e = [math.exp(v - top) for v in z]
    total = sum(e)
    return [v / total for v in e]


def fgrpo_weights(
    rewards: Sequence[float], baselines: Sequence[float | None], tau: float, eps: float = EPS
) -> list[float]:
    """FGRPO's aggregation weights alpha_k = softmax(g_k / tau)."""
    return softmax_weights(relative_gains(rewards, baselines, eps), tau)


def fedavg_weights(sizes: Sequence[int]) -> list[float]:
    """FedAvg: n_k / sum n."""
    total = sum(sizes)
    if total <= 0 or any(n < 0 for n in sizes):
        raise CorpError(f"FedAvg needs non-negative data sizes with a positive sum, got {list(sizes)}")
    return [n / total for n in sizes]


def ema_update(baseline: float | None, reward: float, decay: float = 0.9) -> float:
    """b <- decay b + (1 - decay) R; the first reward starts the average."""
    return reward if baseline is None else decay * baseline + (1.0 - decay) * reward


def weighted_sum(deltas: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """sum_k w_k Delta_k, name by name (every delta must hold the same names and shapes)."""
    if not deltas:
        raise CorpError("no client update to aggregate")
    names = list(deltas[0])
    for d in deltas[1:]:
        if list(d) != names or any(d[n].shape != deltas[0][n].shape for n in names):
            raise CorpError("client updates hold different tensors; every client must train the same parameters")
    out = {}
    for n in names:
        acc = torch.zeros_like(deltas[0][n], dtype=torch.float32)
        for d, w in zip(deltas, weights):
            acc += float(w) * d[n].float()
        out[n] = acc
    return out
