"""CoRP pass 2 (arXiv 2605.31494; docs/methods.md "CoRP", stage 1 steps 3-4): compatibility-reweighted
softmax. With m1 = sum w1_i p_i (pass 1), alignment a_i = cos(p_i, m1) and dispersion
d_i = |p_i - proj_m1 p_i|^2 from the Gram matrix; w2 = softmax(beta r_i + z(a_i) - z(d_i)), z the
z-score over the elites (0 when the spread is ~0). Exact when given the exact Gram matrix (ours,
the default); the public code's seed-orthogonal shortcut is the same rule on the approximate Gram."""

from __future__ import annotations

import numpy as np

from corp.algorithms.corp_operator.algebra import compat_terms, softmax
from corp.algorithms.corp_operator.merge_rules import pass1
from corp.algorithms.corp_operator.merge_rules.base import MergeParams, MergeRule
from corp.algorithms.stats import zscore


def weights(rewards: np.ndarray, gram: np.ndarray, params: MergeParams) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    a, d = compat_terms(pass1.weights(r, gram, params), gram)
    return softmax(params.beta * r + zscore(a) - zscore(d))


RULE = MergeRule("pass2", "m2", weights)
