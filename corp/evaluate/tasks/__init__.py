"""Task registry: `get_task('arith:digits=3')`, `get_task('jsonl:PATH:prompt=question')`,
`get_task('rg:chain_sum:max_terms=2')`, `get_task('reorder:story.txt')`, `list_tasks()`.

Every task also takes two generation options (they travel with the task, so a run records them):
`max_new_tokens=N` (its generation length; `--max-new-tokens` still overrides) and `stop=S1|S2`
(generation stops at the first of these strings, which is cut from the completion; `\\n`, `\\t`
and `\\|` are escapes, so `stop=\\n` stops at the end of the first line).
"""

from __future__ import annotations

import inspect

from corp import CorpError
from corp.evaluate.tasks.arith import Arith
from corp.evaluate.tasks.base import SPLITS, Example, SplitSizes, Task, make_splits
from corp.evaluate.tasks.code import MBPP, HumanEval
from corp.evaluate.tasks.countdown import Countdown
from corp.evaluate.tasks.gsm8k import GSM8K
from corp.evaluate.tasks.jsonl import JsonlTask
from corp.evaluate.tasks.math500 import Math500
from corp.evaluate.tasks.reorder import Reorder

TASKS: dict[str, type[Task]] = {"arith": Arith, "countdown": Countdown, "gsm8k": GSM8K, "math500": Math500, "mbpp": MBPP, "humaneval": HumanEval, "reorder": Reorder}
GENERATION_OPTIONS = ("max_new_tokens", "stop")


def _coerce(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _parse_stop(value: str) -> tuple[str, ...]:
    out, cur, i = [], "", 0
    escapes = {"n": "\n", "t": "\t", "|": "|", "\\": "\\"}
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value) and value[i + 1] in escapes:
            cur += escapes[value[i + 1]]
            i += 2
            continue
        if ch == "|":
            out.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    out.append(cur)
    stops = tuple(s for s in out if s)
    if not stops:
        raise CorpError(f"task option stop='{value}' names no stop string; e.g. stop=\\n or stop=###|Question:")
    return stops


def _options(spec: str, rest: str) -> dict:
    kwargs = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise CorpError(f"task option '{item}' in '{spec}' is not key=value")
        key = key.strip()
        kwargs[key] = value.strip() if key == "stop" else _coerce(value.strip())
    return kwargs


def _path_and_options(spec: str, rest: str) -> tuple[str, dict]:
    """'PATH' or 'PATH:key=value,...' (a path may itself hold ':' but options come after the last one)."""
    path, sep, tail = rest.rpartition(":")
    if sep and "=" in tail and path:
        return path, _options(spec, tail)
    return rest, {}


def _apply_generation_options(task: Task, spec: str, options: dict) -> Task:
    if "max_new_tokens" in options:
        n = options["max_new_tokens"]
        if not isinstance(n, int) or n < 1:
            raise CorpError(f"task option max_new_tokens in '{spec}' must be an integer >= 1, got {n!r}")
        task.max_new_tokens = n
    if "stop" in options:
        task.stop = _parse_stop(str(options["stop"]))
        # stop strings change every completion, so they are part of what identifies the task's
        # rows (the run meta and the evaluation cache key on task.signature())
        plain = task.signature
        task.signature = lambda: {**plain(), "stop": list(task.stop)}
    return task


def get_task(spec: str, data_dir: str | None = None) -> Task:
    """Build a task from `name`, `name:key=value,...`, `jsonl:PATH[:key=value,...]`,
    `rg:NAME[:key=value,...]` or `reorder[:PATH][:key=value,...]`."""
    name, _, rest = spec.partition(":")
    if name in ("jsonl", "csv", "parquet"):
        if not rest:
            raise CorpError(f"task '{name}' needs a path: --task jsonl:PATH (.jsonl, .csv or .parquet)")
        path, kwargs = _path_and_options(spec, rest)
        gen = {k: kwargs.pop(k) for k in GENERATION_OPTIONS if k in kwargs}
        unknown = set(kwargs) - {"prompt", "answer", "id"}
        if unknown:
            raise CorpError(f"task jsonl has no option(s) {', '.join(sorted(unknown))}; options: prompt=FIELD, answer=FIELD, id=FIELD, max_new_tokens=N, stop=S")
        return _apply_generation_options(JsonlTask(path, **{k: str(v) for k, v in kwargs.items()}), spec, gen)
    if name == "rg":
        from corp.evaluate.tasks.rg import ReasoningGymTask

        dataset, _, opts = rest.partition(":")
        if not dataset:
            raise CorpError("task 'rg' needs a dataset name: --task rg:NAME (`corp tasks` lists them)")
        kwargs = _options(spec, opts)
        gen = {k: kwargs.pop(k) for k in GENERATION_OPTIONS if k in kwargs}
        return _apply_generation_options(ReasoningGymTask(dataset, **kwargs), spec, gen)
    if name not in TASKS:
        raise CorpError(f"unknown task '{name}'; known: {', '.join(sorted(TASKS))}, jsonl:PATH, rg:NAME (see `corp tasks`)")
    if name == "reorder" and rest and "=" not in rest.split(":", 1)[0]:
        path, kwargs = _path_and_options(spec, rest)
        kwargs["path"] = path
    else:
        kwargs = _options(spec, rest)
    gen = {k: kwargs.pop(k) for k in GENERATION_OPTIONS if k in kwargs}
    cls = TASKS[name]
    params = inspect.signature(cls.__init__).parameters
    if "data_dir" in params:
        kwargs.setdefault("data_dir", data_dir)
    unknown = set(kwargs) - set(params)
    if unknown:
        raise CorpError(f"task '{name}' has no option(s) {', '.join(sorted(unknown))}; see `corp tasks`")
    try:
        task = cls(**kwargs)
    except (TypeError, ValueError) as exc:  # e.g. arith:digits=abc reaching int()
        raise CorpError(f"task '{spec}': an option has a value of the wrong type ({exc}); see `corp tasks`") from None
    return _apply_generation_options(task, spec, gen)


def list_tasks() -> list[dict]:
    """One row per task ({'task', 'description'}); reasoning-gym's datasets when it is installed,
    else one row saying how to install it."""
    from corp.evaluate.tasks.rg import rg_datasets

    rows = [{"task": n, "description": c.description} for n, c in sorted(TASKS.items())]
    rows.append({"task": "jsonl:PATH", "description": JsonlTask.description})
    rows.append({"task": "(any task)", "description": "generation options: max_new_tokens=N, stop=S1|S2 (e.g. arith:max_new_tokens=12,stop=\\n)"})
    gym = rg_datasets()
    if gym:
        for ds, desc in gym.items():
            rows.append({"task": f"rg:{ds}", "description": f"reasoning-gym: {desc}"})
    else:
        rows.append({"task": "rg:NAME", "description": "reasoning-gym's ~100 procedural datasets: not installed; pip install 'corp[reasoning-gym]'"})
    return rows


__all__ = ["SPLITS", "Example", "SplitSizes", "Task", "TASKS", "get_task", "list_tasks", "make_splits"]
