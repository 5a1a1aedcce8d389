"""The merge-rule contract: a rule maps the elites' rewards and the Gram matrix of their
perturbations (exact, or its seed-orthogonal approximation) to one weight per elite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MergeParams:
    """The grid point a rule is evaluated at."""

    q: float
    """Elite quantile that chose the elites (for reports; the rule sees only the elites)."""
    beta: float
    """Softmax inverse temperature on the raw rewards."""


@dataclass(frozen=True)
class MergeRule:
    name: str
    """Registry key, used by --merge-rules."""
    label: str
    """Short name of the merged direction in candidate names and reports (m1, m2, ...)."""
    weights: Callable[[np.ndarray, np.ndarray, MergeParams], np.ndarray]
    """(rewards over E, Gram <p_i, p_j> over E, params) -> weights over E (they need not sum to 1)."""
