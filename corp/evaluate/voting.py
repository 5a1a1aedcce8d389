"""Majority voting and the unbiased pass@k estimator (docs/methods.md, "Evaluation conventions")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """Most common non-empty answer; ties go to the answer given first (the higher-ranked voter)."""
    valid = [a for a in answers if a not in (None, "")]
    if not valid:
        return None
    counts = Counter(valid)
    best = max(counts.values())
    for a in valid:  # first in rank order among the most common
        if counts[a] == best:
            return a
    return None  # unreachable


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), computed as a stable product (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
