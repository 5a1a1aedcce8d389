"""Reward functions: plain functions `(completions, **columns) -> list[float | None]` (TRL's form).

`--reward` names a built-in (`correct`, the task's own check) or a dotted path `pkg.module:function`
(or `pkg.module.function`). Columns passed are `prompt`, `answer` and the example's extra columns,
each a list aligned with `completions`. A reward that raises, returns NaN/None or falls outside
[0, 1] for an example scores 0 there and is counted, never aborting a run.
"""

from __future__ import annotations

import importlib
import math
import warnings
from typing import Callable, Sequence

from corp import CorpError
from corp.evaluate.tasks.base import Example, Task


def resolve_reward(spec: str | None) -> Callable | None:
    """None or 'correct' -> None (use the task's own reward); else import the named function."""
    if spec in (None, "", "correct"):
        return None
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise CorpError(f"--reward '{spec}' is not a built-in ('correct') or a dotted path 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CorpError(f"--reward '{spec}': cannot import module '{module_name}' ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CorpError(f"--reward '{spec}': module '{module_name}' has no function '{attr}'")
    return fn


def _columns(examples: Sequence[Example]) -> dict[str, list]:
    cols: dict[str, list] = {"prompt": [e.prompt for e in examples], "answer": [e.answer for e in examples]}
    keys = set().union(*(e.columns.keys() for e in examples)) if examples else set()
    for k in sorted(keys - set(cols)):
        cols[k] = [e.columns.get(k) for e in examples]
    return cols


def _clean(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(v) or v < 0.0 or v > 1.0:
        return None
    return v


def compute_rewards(task: Task, completions: list[str], examples: Sequence[Example], reward_fn: Callable | None = None) -> tuple[list[float], int]:
    """Rewards for aligned completions/examples and the number of examples whose reward failed (scored 0)."""

    def call(comps: list[str], exs: Sequence[Example]):
        if reward_fn is None:
            return task.reward(comps, exs)
        return reward_fn(comps, **_columns(exs))

    try:
        raw = list(call(completions, examples))
        if len(raw) != len(completions):
            raise ValueError(f"returned {len(raw)} values for {len(completions)} completions")
    except Exception:
        raw = []  # isolate the example(s) that fail
        for c, e in zip(completions, examples):
            try:
                out = list(call([c], [e]))
                raw.append(out[0] if len(out) == 1 else None)
            except Exception as exc:
                warnings.warn(f"reward failed on example '{e.id}' ({type(exc).__name__}: {exc}); scored 0")
                raw.append(None)
    rewards, errors = [], 0
    for v in raw:
        cleaned = _clean(v)
        if cleaned is None:
            errors += 1
            cleaned = 0.0
        rewards.append(cleaned)
    return rewards, errors
