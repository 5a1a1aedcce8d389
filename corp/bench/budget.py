"""Matched compute: which population prefix or training checkpoint a FLOP budget buys.

Pure functions on ledgers (lists of FLOPs), so the rules are tested on hand-made numbers:
- a population method at budget B gets the largest prefix (in population order) whose summed
  scoring FLOPs are <= B (`prefix_that_fits`);
- an iterative method (ES, GRPO) at budget B is evaluated at its last checkpoint whose cumulative
  training FLOPs are at or below B (corp.bench.sweep grows the run by what the remaining budget
  buys at the dearest unit cost seen). `first_crossing` and `next_units` are the first edition's
  rule (the first checkpoint at or above B); the sweep no longer uses them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from corp.runtime.ledger import flops


def prefix_that_fits(costs: Sequence[float], budget: float) -> int:
    """Largest n such that sum(costs[:n]) <= budget (0 when even the first does not fit)."""
    total, n = 0.0, 0
    for c in costs:
        if total + c > budget:
            break
        total += c
        n += 1
    return n


def first_crossing(cumulative: Sequence[float], budget: float) -> int | None:
    """Index of the first checkpoint whose cumulative FLOPs are >= budget; None if none reaches it."""
    for i, f in enumerate(cumulative):
        if f >= budget:
            return i
    return None


def next_units(units: int, flops: float, budget: float) -> int:
    """Units to train next when `units` units spent `flops` < budget: the mean cost per unit so far
    extrapolated to the budget, and always at least one more unit."""
    if flops <= 0:
        return units + 1
    return max(units + 1, math.ceil(budget / (flops / units)))


def min_budget(unit_evals: float, min_units: int, n_params: int, support_prompt_tokens: int, n_support: int) -> float:
    """A lower bound on the FLOPs of a method's smallest run: `min_units` units of `unit_evals`
    support-split evaluations, each at least the support prompts plus one generated token per
    example (2 N FLOPs per token)."""
    return flops(n_params, support_prompt_tokens, n_support) * unit_evals * min_units
