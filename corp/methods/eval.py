"""`corp eval`: a model on the test split, greedy accuracy and pass@k (corp/evaluate/passk.py, in the
core because the bench and retention scoring evaluate models too)."""

from __future__ import annotations

from corp.evaluate.passk import NAME, EvalConfig, run_eval
from corp.method import SMALL, Method

METHOD = Method(
    NAME,
    EvalConfig,
    run_eval,
    "Evaluate a model on the test split: greedy accuracy; pass@k from n samples per problem with --pass-k.",
    smoke={**SMALL, "pass_k": "1,2", "n_samples": 2},
)
