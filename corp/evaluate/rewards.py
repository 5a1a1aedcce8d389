"""Reward functions: `--reward` names a built-in (`correct`, the task's own reward) or a user function.

Where the function lives: `module:function` / `pkg.module.function` (imported with the working
directory on the import path, so a `my_reward.py` beside you is found without PYTHONPATH), or a
file `path/to/file.py:function`.

Two forms, told apart by the name of the function's first parameter:

- per-completion: `def f(completion, answer, **columns) -> float` (first parameter named
  `completion`); called once per completion with that example's `answer`, `prompt` and extra
  columns as keyword arguments.
- batched, TRL's form: `def f(completions, **kwargs) -> list[float | None]` (any other first
  parameter); called once per evaluation with `completions` and `prompts` (lists, TRL's names) and
  one list per column (`prompt`, `answer`, the data file's other fields), all aligned. A function
  without `**kwargs` gets only the columns it names. A function with a parameter named
  `completions` gets it by keyword (so TRL's `(prompts, completions, **kw)` works); otherwise
  completions are the first positional argument.

From Python (`corp.api`), functions are passed as objects: `register_reward` combines one or more
of them (TRL's `reward_funcs` and `reward_weights`) into one batched reward known in this process by
the spec `python:NAMES@HASH` (the hash covers the functions' source, the values they carry and the
plain module-level globals they read, so cached rows follow the code and its values).

A reward may be any finite float (TRL's convention); rewards are not clipped to [0, 1]. A value
that is None, NaN, infinite or not a number, or an exception, scores 0 for that example and is
counted in the row's `reward_errors`. A function that fails on every example of an evaluation
before it has ever returned a usable value is a broken function, not a bad completion: that stops
the run with one line naming the function and its first error. So does a batched function that
returns other than one value per completion (a wrong length, or not a list), and rewards whose
sum over an evaluation is not finite in float32 (|sum| > 3.4e38: values such as 1e308 each
finite, but their mean overflows; GRPO and ES compute with rewards in float32).

Methods whose hyperparameters assume a reward scale: RandOpt ranks (scale-free); ES z-scores or
rank-transforms fitness; GRPO divides advantages by the group's standard deviation (TRL's
`scale_rewards`); CoRP's `softmax(beta * r)` acts on raw rewards, so a reward on another scale than
[0, 1] changes what a given beta means (see the consolidation docs for how it normalises).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task


class RewardFunction:
    """A user reward, resolved and classified once: `per_completion` or batched (TRL's form)."""

    def __init__(self, fn: Callable, spec: str):
        self.fn, self.spec = fn, spec
        self.name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # builtins without a signature: treat as batched, positional
            params = []
        names = [p.name for p in params]
        self.per_completion = bool(names) and names[0] == "completion"
        self.completions_by_keyword = "completions" in names
        # a function without **kwargs gets only the columns it names (so `(completion, answer)` works)
        self.accepts = (
            None
            if (not params or any(p.kind is p.VAR_KEYWORD for p in params))
            else set(names[1:]) | ({"completions"} if self.completions_by_keyword else set())
        )
        self.ever_succeeded = False  # see compute_rewards: a function that never worked stops the run

    def __call__(self, completions: list[str], **columns) -> list:
        if self.per_completion:
            if self.accepts is not None:
                columns = {k: v for k, v in columns.items() if k in self.accepts}
            return [self.fn(c, **{k: v[i] for k, v in columns.items()}) for i, c in enumerate(completions)]
        kwargs = {"prompts": columns.get("prompt"), **columns}  # `prompts`: TRL's name for the prompt column
        if self.accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        if self.completions_by_keyword:
            return self.fn(completions=completions, **kwargs)
        return self.fn(completions, **kwargs)

    def __repr__(self) -> str:
        return f"RewardFunction({self.spec!r}, {'per-completion' if self.per_completion else 'batched'})"


def _import_module(module_name: str, spec: str):
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise CorpError(f"--reward '{spec}': file '{path}' does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"corp_user_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        return module
    # the working directory is on the import path for `python -m`, not for the `corp` script
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # appended: a local file never shadows an installed module
    return importlib.import_module(module_name)


def resolve_reward(spec: str | None) -> RewardFunction | None:
    """None or 'correct' -> None (use the task's own reward); else import and classify the named function."""
    if spec in (None, "", "correct"):
        return None
    if isinstance(spec, RewardFunction):
        return spec
    if isinstance(spec, str) and spec.startswith(IN_PROCESS):
        if spec not in _REGISTERED:
            raise CorpError(
                f"reward '{spec}' is a Python function given to corp's Python API in another process; a run "
                "resumed from the command line, a --config file or a Ray worker needs it by name: "
                "--reward module:function or file.py:function"
            )
        return _REGISTERED[spec]
    if callable(spec):
        return RewardFunction(spec, getattr(spec, "__name__", repr(spec)))
    module_name, _, attr = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise CorpError(
            f"--reward '{spec}' is not a built-in ('correct'), a dotted path 'module:function' or 'file.py:function'"
        )
    try:
        module = _import_module(module_name, spec)
    except CorpError:
        raise
    except Exception as exc:
        raise CorpError(f"--reward '{spec}': cannot import '{module_name}' ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CorpError(f"--reward '{spec}': '{module_name}' has no function '{attr}'")
    return RewardFunction(fn, spec)


# ---------------------------------------------------------------- functions given in Python (corp.api)

IN_PROCESS = "python:"  # the prefix of a reward registered in this process (`register_reward`)
_REGISTERED: dict[str, RewardFunction] = {}


def _fingerprint(fn: Callable) -> str:
    """What a Python function is, for cache keys: its module, name and source text (its bytecode when
    the source cannot be read), the values it carries (a partial's arguments, defaults, the contents
    of a closure's cells) and the plain module-level globals it reads (`_globals_read`). A value whose repr names a memory address (an object without a
    stable repr) cannot key a cache: one line asks for a function that does not capture it."""
    parts = []
    while hasattr(fn, "func"):  # functools.partial (nested ones too): its arguments are part of what it is
        parts.append(f"partial{fn.args!r}{sorted(fn.keywords.items())!r}")
        fn = fn.func
    try:
        body = inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        body = code.co_code.hex() if code is not None else repr(fn)
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    parts += [repr(getattr(fn, "__defaults__", None)), repr(getattr(fn, "__kwdefaults__", None)), repr(cells)]
    carried = "\n".join(parts)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    if " at 0x" in carried:
        raise CorpError(
            f"reward function {name} carries a value without a stable repr (a closure cell, default or partial "
            "argument), so corp cannot key its cache on it: pass such values as dataset columns or use a "
            "module-level function of plain values"
        )
    return f"{name}\n{body}\n{carried}\n{_globals_read(fn)}"


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _globals_read(fn: Callable, seen: set | None = None) -> str:
    """The module-level globals `fn` reads, by name, as values: those of plain data (numbers, text,
    and lists, tuples, sets and dicts of them); a plain function of the same module it calls counts
    with its source and its own globals. A global changed between two runs (THRESHOLD = 0.5, then
    0.9) is then another reward, not a resume of the first's rows. Other globals (modules, classes,
    objects) are not part of the identity (docs/api.md)."""
    seen = set() if seen is None else seen
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if code is None or names is None or code in seen:
        return ""
    seen.add(code)
    parts = []
    for name in sorted(_names_read(code)):
        if name not in names:
            continue
        value = names[name]
        if _plain(value):
            parts.append(f"{name}={_canonical(value)}")
        elif inspect.isfunction(value) and value.__module__ == fn.__module__:
            try:
                source = inspect.getsource(value)
            except (OSError, TypeError):
                source = value.__code__.co_code.hex()
            parts.append(f"{name}:{source}{_globals_read(value, seen)}")
    return "\n".join(parts)


def _names_read(code) -> set[str]:
    """Global names a code object and the code nested in it (lambdas, inner functions, comprehensions) load."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names_read(const)
    return names


def _plain(value, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if depth > 3:
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _canonical(value) -> str:
    """repr, with sets in sorted order (a set of strings iterates in another order in every process)."""
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_canonical(v) for v in value)) + "}"
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "(" + ", ".join(_canonical(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_canonical(k)}: {_canonical(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _filled(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # a cell not yet assigned (a recursive closure before its definition ran)
        return False
    return True


class CombinedReward:
    """TRL's several reward functions as one batched reward: `sum(w_i * r_i)` over the functions
        that gave a value (TRL's `reward_weights`; a None or non-finite value is left out, as TRL's
        nansum); None, scored 0 and counted as an error, when none gave one. An `async def` function is
    awaited. `conversational`: prompts
        and completions reach the functions as TRL's conversational format (lists of message dicts)."""

    def __init__(self, funcs: Sequence[RewardFunction], weights: Sequence[float], conversational: bool = False):
        self.funcs, self.weights, self.conversational = list(funcs), [float(w) for w in weights], conversational

    def __call__(self, completions, **columns) -> list[float | None]:
        if self.conversational:
            completions = [[{"role": "assistant", "content": c}] for c in completions]
            messages = [[{"role": "user", "content": p}] for p in columns.get("prompt") or []]
            columns = {**columns, "prompt": messages, "prompts": messages}
        total: list = [None] * len(completions)
        for fn, w in zip(self.funcs, self.weights):
            out = fn(completions, **columns)
            if inspect.isawaitable(out):  # TRL's `async def` rewards; a thread of its own, as a notebook runs a loop
                with ThreadPoolExecutor(1) as pool:
                    out = pool.submit(asyncio.run, _awaited(out)).result()
            values = _one_per_completion(out, len(completions), fn.spec)
            for i, v in enumerate(values):
                cleaned = _clean(v)
                if cleaned is not None:
                    total[i] = (total[i] if isinstance(total[i], float) else 0.0) + w * cleaned
                elif total[i] is None:  # what the first function gave, for the message if none gives a value
                    total[i] = Unscored(f"{_describe(v)} from {fn.name}")
        return total


class Unscored:
    """A combined reward that no function gave a value for; it prints what the first function returned
    (so the message names NaN, '1.0' or an array, not a None corp made), and is no number."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return self.what


async def _awaited(awaitable):
    return await awaitable


def register_reward(
    funcs: Sequence[Callable], weights: Sequence[float] | None = None, conversational: bool = False
) -> str:
    """Python reward functions (TRL's form, or corp's per-completion form) as one `--reward` spec
    valid in this process: `python:NAMES@HASH`, the hash over each function's fingerprint, the
    weights and the format, so cached rows follow the code."""
    funcs = list(funcs)
    if not funcs:
        raise CorpError("reward_funcs is empty; give a function, a list of them, or None for the task's own check")
    weights = [1.0] * len(funcs) if weights is None else list(weights)
    if len(weights) != len(funcs):
        raise CorpError(f"reward_weights has {len(weights)} values for {len(funcs)} reward functions; give one each")
    bad = [w for w in weights if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w)]
    if bad:
        raise CorpError(f"reward_weights must be finite numbers, got {bad[0]!r}")
    resolved = [resolve_reward(f) for f in funcs]
    if any(r is None for r in resolved):
        raise CorpError("reward_funcs: 'correct' (the task's own check) cannot be combined with other functions")
    names = "+".join(getattr(getattr(f, "fn", f), "__name__", "reward") for f in resolved)
    h = hashlib.sha256(
        "\n".join([*(_fingerprint(r.fn) for r in resolved), repr(weights), str(conversational)]).encode()
    ).hexdigest()[:16]
    spec = f"{IN_PROCESS}{names}@{h}"
    if spec not in _REGISTERED:
        _REGISTERED[spec] = RewardFunction(CombinedReward(resolved, weights, conversational), spec)
    return spec


def reward_identity(spec) -> str:
    """What a reward is, in cache keys and a resumed run's checks: 'correct', or its module's resolved
    file and the function's name, so `rw.py:f`, `./rw.py:f`, `/abs/rw.py:f` and `rw:f` run from the
    same place are one reward (the spec as given, when its module cannot be found)."""
    if spec in (None, "", "correct"):
        return "correct"
    if not isinstance(spec, str):
        return spec  # a function passed by a library caller: as before
    if spec.startswith(IN_PROCESS):
        return spec  # `register_reward`'s spec carries the hash of the functions' code
    module_name, _, attr = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        return f"{Path(module_name).expanduser().resolve()}:{attr}"
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    origin = getattr(found, "origin", None)
    return f"{Path(origin).resolve()}:{attr}" if origin and os.path.isfile(origin) else spec


def _columns(examples: Sequence[Example]) -> dict[str, list]:
    cols: dict[str, list] = {"prompt": [e.prompt for e in examples], "answer": [e.answer for e in examples]}
    keys = set().union(*(e.columns.keys() for e in examples)) if examples else set()
    for k in sorted(keys - set(cols)):
        cols[k] = [e.columns.get(k) for e in examples]
    return cols


def _clean(value) -> float | None:
    """Any finite float (bools count as 0/1); None for None, NaN, +-inf and non-numbers."""
    if value is None or isinstance(value, (str, bytes)) or getattr(value, "ndim", 0):
        return None  # an array of one or more dimensions is not one value, even of size 1
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def _describe(value) -> str:
    """A returned value as a message shows it: its repr, shortened, and its type (and shape, for an
    array), so NaN, inf, the string '1.0' and a 2-D array each read as what they are."""
    if isinstance(value, Unscored):
        return repr(value)
    text = " ".join(repr(value).split())
    text = text if len(text) <= 60 else text[:57] + "..."
    shape = getattr(value, "shape", None)
    kind = type(value).__name__ + (f" of shape {tuple(shape)}" if shape is not None and len(shape) else "")
    return f"{text} ({kind})"


_FLOAT32_MAX = 3.4028234663852886e38


def _one_per_completion(out, n: int, name: str) -> list:
    """A batched reward's result as a list of n values, or one line: a wrong length or shape is a
    broken function (re-calling it one completion at a time would accept answers to other questions)."""
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
        raise CorpError(f"reward {name} returned {_describe(out)}, not a list of one value per completion ({n})")
    raw = list(out)
    if len(raw) != n:
        raise CorpError(
            f"reward {name} returned {len(raw)} values for {n} completions; "
            "a batched reward returns one value per completion, in order"
        )
    return raw


def _call_reward(task: Task, reward_fn: RewardFunction | None, comps: list[str], exs: Sequence[Example]):
    """One call of the reward in use: the task's own check, or the user's function given the columns."""
    if reward_fn is None:
        return task.reward(comps, exs)
    return reward_fn(comps, **_columns(exs))


def _isolate_failures(
    call: Callable, completions: list[str], examples: Sequence[Example], batch_exc: Exception, first_problem: list[str]
) -> list:
    """After the batched call raised: call once per example, so only the example(s) that fail score
    None; the first failure (or the batch's own error) is noted for the messages."""
    raw = []
    for c, e in zip(completions, examples):
        try:
            out = list(call([c], [e]))
            if len(out) != 1:
                raise ValueError(f"returned {len(out)} values for 1 completion")
            raw.append(out[0])
        except CorpError:
            raise
        except Exception as exc:
            if not first_problem:
                first_problem.append(f"on example '{e.id}': {type(exc).__name__}: {exc}")
            raw.append(None)
    if not first_problem and len(completions) > 1:
        first_problem.append(f"{type(batch_exc).__name__}: {batch_exc}")
    return raw


def _score_values(raw: list, first_problem: list[str]) -> tuple[list[float], int]:
    """Raw values as rewards: a value that is not a finite number scores 0 and is counted."""
    rewards, errors = [], 0
    for v in raw:
        cleaned = _clean(v)
        if cleaned is None:
            errors += 1
            if not first_problem:
                first_problem.append(f"returned {_describe(v)}, not a finite number")
            cleaned = 0.0
        rewards.append(cleaned)
    return rewards, errors


def _check_sum(rewards: list[float], name: str) -> None:
    """GRPO and ES average rewards in float32: a sum it cannot hold stops the run."""
    if not abs(sum(rewards)) <= _FLOAT32_MAX:  # a float64 overflow gives inf, also refused
        raise CorpError(
            f"reward {name}: its {len(rewards)} values (largest {max(rewards, key=abs):g}) sum to more than float32 "
            "holds, so their mean is not a finite reward; return rewards on a smaller scale"
        )


def _record_outcome(state, name: str, n: int, errors: int, first_problem: list[str]) -> None:
    """A function that fails on a whole first evaluation is broken (one line); once it has worked,
    failures are per example: remembered as success on `state`, warned about and scored 0."""
    succeeded_before = getattr(state, "ever_succeeded", False)
    if n and errors == n and not succeeded_before:
        raise CorpError(
            f"reward {name} failed on all {n} examples of its first "
            f"evaluation; first error: {first_problem[0]}. A reward is `(completions, "
            "**columns) -> list[float]` or `(completion, answer, **columns) -> float`"
        )
    if errors < n:
        try:
            state.ever_succeeded = True
        except AttributeError:
            pass
    if errors:
        warnings.warn(
            f"reward {name} failed on {errors} of {n} example(s) (first: "
            f"{first_problem[0] if first_problem else '?'}); scored 0 and counted"
        )


def compute_rewards(
    task: Task, completions: list[str], examples: Sequence[Example], reward_fn: Callable | None = None
) -> tuple[list[float], int]:
    """Rewards for aligned completions/examples and the number of examples whose reward failed (scored 0).

    Raises CorpError when every example fails and the function has never produced a usable value
    in this process (a wrong signature, a function that always raises or always returns NaN)."""
    if reward_fn is not None and not isinstance(reward_fn, RewardFunction):
        reward_fn = resolve_reward(reward_fn)
    name = reward_fn.spec if reward_fn is not None else f"the reward of task '{task.name}'"
    first_problem: list[str] = []

    def call(comps: list[str], exs: Sequence[Example]):
        return _call_reward(task, reward_fn, comps, exs)

    try:
        out = call(completions, examples)
    except CorpError:
        raise
    except Exception as batch_exc:
        raw = _isolate_failures(call, completions, examples, batch_exc, first_problem)
    else:
        raw = _one_per_completion(out, len(completions), name)
    rewards, errors = _score_values(raw, first_problem)
    _check_sum(rewards, name)
    state = reward_fn if reward_fn is not None else task
    _record_outcome(state, name, len(completions), errors, first_problem)
    return rewards, errors
