"""Task registry: `get_task('arith:digits=3')`, `get_task('jsonl:PATH')`, `list_tasks()`."""

from __future__ import annotations

from corp import CorpError
from corp.evaluate.tasks.arith import Arith
from corp.evaluate.tasks.code import MBPP, HumanEval
from corp.evaluate.tasks.base import SPLITS, Example, SplitSizes, Task, make_splits
from corp.evaluate.tasks.countdown import Countdown
from corp.evaluate.tasks.gsm8k import GSM8K
from corp.evaluate.tasks.jsonl import JsonlTask
from corp.evaluate.tasks.math500 import Math500

TASKS: dict[str, type[Task]] = {"arith": Arith, "countdown": Countdown, "gsm8k": GSM8K, "math500": Math500, "mbpp": MBPP, "humaneval": HumanEval}


def _coerce(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def get_task(spec: str, data_dir: str | None = None) -> Task:
    """Build a task from `name`, `name:key=value,...` or `jsonl:PATH`."""
    name, _, rest = spec.partition(":")
    if name == "jsonl":
        if not rest:
            raise CorpError("task 'jsonl' needs a path: --task jsonl:PATH")
        return JsonlTask(rest)
    if name not in TASKS:
        raise CorpError(f"unknown task '{name}'; known: {', '.join(sorted(TASKS))}, jsonl:PATH (see `corp tasks`)")
    kwargs = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise CorpError(f"task option '{item}' in '{spec}' is not key=value")
        kwargs[key.strip()] = _coerce(value.strip())
    cls = TASKS[name]
    import inspect

    params = inspect.signature(cls.__init__).parameters
    if "data_dir" in params:
        kwargs.setdefault("data_dir", data_dir)
    unknown = set(kwargs) - set(params)
    if unknown:
        raise CorpError(f"task '{name}' has no option(s) {', '.join(sorted(unknown))}; see `corp tasks`")
    return cls(**kwargs)


def list_tasks() -> list[dict]:
    rows = [{"task": n, "description": c.description} for n, c in sorted(TASKS.items())]
    rows.append({"task": "jsonl:PATH", "description": JsonlTask.description})
    return rows


__all__ = ["SPLITS", "Example", "SplitSizes", "Task", "TASKS", "get_task", "list_tasks", "make_splits"]
