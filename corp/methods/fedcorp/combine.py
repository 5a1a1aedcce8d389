"""Federated CoRP's combination of per-client rewards (`corp fedcorp --combine mean|gain`).

Only `corp fedcorp` uses it, so it stays in corp/methods/fedcorp/; the aggregation rules it builds on
(FedAvg's data-size weights) are in the core module `corp/algorithms/aggregation.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

from corp.algorithms.aggregation import EPS, fedavg_weights
from corp.errors import CorpError

COMBINE_RULES = ("mean", "gain")


def combine_client_rewards(
    rewards: Sequence[Sequence[float]], sizes: Sequence[int], baselines: Sequence[float], rule: str, eps: float = EPS
) -> list[float]:
    """Federated CoRP: one reward per specialist from K clients' mean rewards (K x N).

    mean: data-weighted mean, sum_k n_k R_ki / sum n_k, which equals the specialist's mean reward on
    the pooled examples (so federated stage 1 sees what centralised stage 1 would).
    gain: data-weighted mean of each client's relative gain over its own base-model reward b_k,
    (R_ki - b_k) / (|b_k| + eps), FGRPO's normalisation across clients: a client whose base is weak
    counts by how much a specialist improves on it, not by its raw scale.
    """
    if rule not in COMBINE_RULES:
        raise CorpError(f"--combine '{rule}' is unknown; choose one of {', '.join(COMBINE_RULES)}")
    w = fedavg_weights(sizes)
    n = len(rewards[0])
    if any(len(r) != n for r in rewards):
        raise CorpError("clients returned rewards for different numbers of specialists")
    if rule == "mean":
        return [sum(wk * rk[i] for wk, rk in zip(w, rewards)) for i in range(n)]
    return [sum(wk * (rk[i] - bk) / (abs(bk) + eps) for wk, rk, bk in zip(w, rewards, baselines)) for i in range(n)]
