"""The validation gate: a paired lower-confidence-bound test of candidate against base.

METHODS.md (CoRP, step 6): per validation example j, d_j = score_cand_j - score_base_j; accept only
if mean(d) - z * sd(d) / sqrt(n) > 0 (z = 1 in the paper). sd is the sample standard deviation
(ddof = 1). With fewer than MIN_VALIDATION examples the normal approximation behind the bound is
not worth much, so callers warn; with n < 2 the gate cannot be computed and rejects.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

MIN_VALIDATION = 30  # below this the normal approximation of the paired mean is poor
MIN_PROBE = 16  # below this the step-size choice is mostly noise


@dataclass
class GateResult:
    accepted: bool
    n: int
    mean_diff: float
    sd_diff: float
    lcb: float
    z: float
    candidate_score: float
    base_score: float
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def paired_gate(candidate: Sequence[float], base: Sequence[float], z: float = 1.0) -> GateResult:
    if len(candidate) != len(base):
        raise ValueError("candidate and base must be scored on the same examples")
    n = len(candidate)
    if n < 2:
        return GateResult(False, n, 0.0, 0.0, float("-inf"), z, 0.0, 0.0, f"validation split has {n} example(s); the gate needs at least 2")
    d = [c - b for c, b in zip(candidate, base)]
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    lcb = mean - z * sd / math.sqrt(n)
    accepted = lcb > 0
    reason = (
        f"accepted: mean gain {mean:+.4f} - {z:g} * sd {sd:.4f} / sqrt({n}) = {lcb:+.4f} > 0"
        if accepted
        else f"rejected: mean gain {mean:+.4f} - {z:g} * sd {sd:.4f} / sqrt({n}) = {lcb:+.4f} <= 0"
    )
    return GateResult(accepted, n, mean, sd, lcb, z, sum(candidate) / n, sum(base) / n, reason)
