"""One model's outcome on one split (`EvalResult`), the one row schema of every cached evaluation
(`result_row`, population rows included), which rows may leave their run (`shareable`), and a
row's per-example values checked against their ids (`row_scores`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from corp.algorithms.stats import PerExample
from corp.runtime.context.keys import eval_key, ids_hash


@dataclass
class EvalResult:
    """Per-example outcome of one model on one split."""

    completions: list[str]
    answers: list[str | None]
    rewards: list[float]
    correct: list[bool]
    prompt_tokens: int
    generated_tokens: int
    seconds: float
    reward_errors: int = 0
    status_counts: dict = field(default_factory=dict)
    reward_seconds: float = 0.0  # scoring the completions (the sandbox, for code tasks)
    truncated: int = 0  # completions that used every new token they were allowed (cut off, most of them)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / len(self.correct) if self.correct else 0.0


ROW_FORMAT = 2  # rows keyed by eval_identity (format 1: "<seed>:<sigma>:<split>" keys, no example ids)


# A row's wall-clock fields: they differ between two runs that computed the same thing
TIMING_FIELDS = ("seconds", "apply_seconds", "reward_seconds", "noise_seconds", "push_seconds")


def completion_hash(text: str) -> str:
    """A short hash of a completion's text: two rows' completions compare without storing them."""
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def result_row(
    identity: dict,
    split: str,
    res: EvalResult,
    kind: str,
    seed: int | None = None,
    sigma: float | None = None,
    apply_seconds: float = 0.0,
    **extra,
) -> dict:
    """The one row schema of every cached evaluation (population rows included)."""
    return {
        "key": eval_key(identity),
        "format": ROW_FORMAT,
        "kind": kind,  # specialist | base | direction | checkpoint | es-specialist | es-centre | ...
        "what": identity["what"],
        "split": split,
        "seed": seed,
        "sigma": sigma,
        "ids_hash": identity["ids_hash"],
        "n_examples": identity["n_examples"],
        "temperature": identity["temperature"],
        "n": identity["n"],
        **({"sample_seed": identity["sample_seed"]} if "sample_seed" in identity else {}),
        "reward": res.mean_reward,
        "accuracy": res.accuracy,
        "rewards": res.rewards,
        "correct": [int(c) for c in res.correct],
        "answers": res.answers,
        # which completions are the same text (noise-scale calibration compares a specialist's with the base's)
        "completion_hashes": [completion_hash(t) for t in res.completions],
        "prompt_tokens": res.prompt_tokens,
        "generated_tokens": res.generated_tokens,
        "seconds": res.seconds,
        "apply_seconds": apply_seconds,
        "reward_seconds": res.reward_seconds,
        "truncated": res.truncated,
        "reward_errors": res.reward_errors,
        "status_counts": res.status_counts,
        "identity": {
            k: identity[k]
            for k in ("model", "weights_hash", "backend", "task", "reward", "max_new_tokens")
            if k in identity
        },
        **extra,
    }


# Rows another run may reuse: greedy evaluations of the base or of seed-defined directions. A
# checkpoint's `what` is a label its own run chose ("es-centre@4"), and sampled rows depend on the
# run's sampling seed, so neither leaves its run.
_SHAREABLE_WHAT = re.compile(r"^(base|dir:[0-9a-f]+)$")


def shareable(row: dict) -> bool:
    return (
        float(row.get("temperature", 0.0)) == 0.0
        and bool(_SHAREABLE_WHAT.match(str(row.get("what", ""))))
        and row.get("kind") != "checkpoint"
    )


def row_scores(row: dict, ids: Sequence[str], field_name: str = "rewards") -> PerExample:
    """A row's per-example values as a PerExample with the ids they were computed on (checked)."""
    if row.get("ids_hash") != ids_hash(ids):
        raise ValueError(f"row {row.get('key')} was computed on other examples than the {len(ids)} given")
    return PerExample(row[field_name], ids)
