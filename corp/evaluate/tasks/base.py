"""The task interface and the split contract (docs/architecture.md, "Splits").

A task gives a pool of examples (prompt, gold answer, extra columns), an answer extractor, a
correctness check on extracted answers (used by majority voting) and a reward (built-in tasks give
rewards in [0, 1]; user rewards may be any finite float, see corp.evaluate.rewards).
Splits support / probe / validation / test are disjoint, sized by the caller, and fixed by a split
seed; test examples come from the task's test pool when it has one, so test data never reaches
selection.
"""

from __future__ import annotations

import inspect
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from corp.errors import CorpError

SPLITS = ("support", "probe", "validation", "test")
GENERATION_OPTIONS = ("max_new_tokens", "stop")  # options every task takes (corp.evaluate.tasks applies them)
# options every task takes that hold part of its pool out of selection (corp.evaluate.tasks applies them)
POOL_OPTIONS = ("heldout", "dev", "select")
GENERIC_OPTIONS = GENERATION_OPTIONS + POOL_OPTIONS


@dataclass(frozen=True)
class Example:
    id: str  # unique within the task
    prompt: str  # the user message (the backend applies the chat template when the model has one)
    answer: str  # gold answer, already normalised for the task's check
    columns: dict = field(default_factory=dict, hash=False, compare=False)  # extra fields passed to reward functions


class Task:
    """Base class: subclasses set `name`, `max_new_tokens`, and implement `pools` and `extract`."""

    name: str = "task"
    description: str = ""
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()  # generation stops at the first of these strings (which is cut from the text)

    def pools(self) -> dict[str, list[Example]]:
        """{'train': [...], 'test': [...]}; a task without a separate test pool returns only 'train'.
        A task with held-out options (`heldout=START,dev=N`) also has a 'dev' pool (tuning, never test)."""
        raise NotImplementedError

    def extract(self, completion: str) -> str | None:
        """The answer in a completion, normalised so that equal answers compare equal; None if there is none."""
        raise NotImplementedError

    def check(self, answer: str | None, example: Example) -> bool:
        """Whether an extracted answer is correct."""
        return answer is not None and answer == example.answer

    def data_name(self, pool: str) -> str:
        """How errors name the data of `pool` ("train": the selection splits', "test": the test split's)."""
        return f"task '{self.name}'"

    def graded(self) -> bool:
        """Whether the examples have gold answers, so that accuracy means something; a data file without
        an answer column (a reward-only task, TRL's usual case) has none, and its reports measure the reward."""
        return True

    def reward(self, completions: list[str], examples: Sequence[Example]) -> list[float | None]:
        """Reward per completion (a finite float; built-in tasks stay in [0, 1]); the default is correctness of the extracted answer."""
        return [float(self.check(self.extract(c), ex)) for c, ex in zip(completions, examples)]

    def signature(self) -> dict:
        """What identifies this task's data and reward (stored in runs; a mismatch on reuse is an error)."""
        return {"name": self.name}

    @classmethod
    def from_spec(cls, spec: str, rest: str, data_dir: str | None = None) -> tuple[Task, dict]:
        """The task `--task spec` names, from `rest` (what follows 'NAME:'), and its generation
        options. The default reads `key=value,...` options of __init__."""
        return cls.from_options(spec, parse_options(spec, rest), data_dir)

    @classmethod
    def from_options(cls, spec: str, kwargs: dict, data_dir: str | None = None) -> tuple[Task, dict]:
        name = spec.partition(":")[0]
        gen = {k: kwargs.pop(k) for k in GENERIC_OPTIONS if k in kwargs}
        params = inspect.signature(cls.__init__).parameters
        if "data_dir" in params:
            kwargs.setdefault("data_dir", data_dir)
        unknown = set(kwargs) - set(params)
        if unknown:
            raise CorpError(f"task '{name}' has no option(s) {', '.join(sorted(unknown))}; see `corp tasks`")
        try:
            task = cls(**kwargs)
        except (TypeError, ValueError) as exc:  # e.g. arith:digits=abc reaching int()
            raise CorpError(
                f"task '{spec}': an option has a value of the wrong type ({exc}); see `corp tasks`"
            ) from None
        return task, gen


# ---------------------------------------------------------------- task specs: NAME[:key=value,...]


def coerce_option(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def parse_options(spec: str, rest: str) -> dict:
    """`key=value,...` of a task spec; numbers become int/float, `stop` stays text."""
    kwargs = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise CorpError(f"task option '{item}' in '{spec}' is not key=value")
        key = key.strip()
        kwargs[key] = value.strip() if key == "stop" else coerce_option(value.strip())
    return kwargs


def path_and_options(spec: str, rest: str) -> tuple[str, dict]:
    """'PATH' or 'PATH:key=value,...' (a path may itself hold ':' but options come after the last one)."""
    path, sep, tail = rest.rpartition(":")
    if sep and "=" in tail and path:
        return path, parse_options(spec, tail)
    return rest, {}


# ---------------------------------------------------------------- answer normalisation helpers

_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def normalize_number(text: str) -> str | None:
    """'1,234.50' -> '1234.5', '$7' -> '7', '-0' -> '0'; None if not a number."""
    t = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(t)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def last_number(text: str) -> str | None:
    matches = _NUM.findall(text)
    for m in reversed(matches):
        n = normalize_number(m)
        if n is not None:
            return n
    return None


# ---------------------------------------------------------------- splits


@dataclass
class SplitSizes:
    support: int = 32
    probe: int = 32
    validation: int = 64
    test: int = 64

    def as_dict(self) -> dict[str, int]:
        return {s: getattr(self, s) for s in SPLITS}


def make_splits(task: Task, sizes: SplitSizes, seed: int, needs: Sequence[str] = SPLITS) -> dict[str, list[Example]]:
    """Disjoint splits drawn with a fixed seed; test from the test pool when the task has one.

    `needs`: the splits the caller uses. One drawn after every needed split (RandOpt's probe and
    validation) is left empty rather than demanding examples a small dataset may not have; one drawn
    before a needed split is still drawn, so the needed splits hold the same examples in every
    method's run (a population scored by one is reused by another)."""
    for split, n in sizes.as_dict().items():
        if n < 0:
            raise CorpError(f"split size --n-{split} must be >= 0, got {n}")
    pools = task.pools()
    rng = random.Random(f"corp-splits|{task.name}|{seed}")
    train = list(pools.get("train", []))
    rng.shuffle(train)
    out: dict[str, list[Example]] = {}
    order = ["test", "support", "probe", "validation"]  # test first, so its contents do not depend on the others
    if "test" in pools:
        test = list(pools["test"])
        rng.shuffle(test)
        n_test = sizes.test if "test" in needs else 0
        if n_test > len(test):
            raise CorpError(f"{task.data_name('test')} has {len(test)} test examples; --n-test {n_test} is too large")
        out["test"] = test[:n_test]
        order.remove("test")
    last = max((order.index(s) for s in needs if s in order), default=-1)
    wanted = {s: getattr(sizes, s) if i <= last else 0 for i, s in enumerate(order)}
    if sum(wanted.values()) > len(train):
        asked = " + ".join(f"{s} {n}" for s, n in wanted.items() if n)
        raise CorpError(
            f"{task.data_name('train')} has {len(train)} examples for selection, fewer than the requested "
            f"{asked}; lower the --n-* split sizes"
        )
    start = 0
    for split, n in wanted.items():
        out[split] = train[start : start + n]
        start += n
    ids = [ex.id for split in SPLITS for ex in out[split]]
    if len(ids) != len(set(ids)):
        raise CorpError(f"task '{task.name}' has duplicate example ids; splits would not be disjoint")
    return {s: out[s] for s in SPLITS}
