"""CoRP pass 1 (arXiv 2605.31494; docs/methods.md "CoRP", stage 1 step 2): w1 = softmax(beta * r)
over the elites. The Gram matrix is not used: pass 1 is the reward-only provisional mean m1."""

from __future__ import annotations

import numpy as np

from corp.algorithms.corp_operator.algebra import softmax
from corp.algorithms.corp_operator.merge_rules.base import MergeParams, MergeRule


def weights(rewards: np.ndarray, gram: np.ndarray, params: MergeParams) -> np.ndarray:
    return softmax(params.beta * np.asarray(rewards, dtype=np.float64))


RULE = MergeRule("pass1", "m1", weights)
