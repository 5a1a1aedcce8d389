"""Task registry: `get_task('arith:digits=3')`, `get_task('jsonl:PATH:prompt=question')`,
`get_task('rg:chain_sum:max_terms=2')`, `get_task('reorder:story.txt')`, `list_tasks()`.

Every task also takes two generation options (they travel with the task, so a run records them):
`max_new_tokens=N` (its generation length; `--max-completion-length` still overrides) and `stop=S1|S2`
(generation stops at the first of these strings, which is cut from the completion; `\\n`, `\\t`
and `\\|` are escapes, so `stop=\\n` stops at the end of the first line); and two pool options,
`heldout=START,dev=N[,select=M]` (corp.evaluate.tasks.heldout: the pool past START is held out of
selection, N of it a development pool, the rest the test pool; select=M narrows selection to the
pool's first M examples).
"""

from __future__ import annotations

from corp.errors import CorpError
from corp.evaluate.tasks.arith import Arith
from corp.evaluate.tasks.base import SPLITS, Example, SplitSizes, Task, make_splits
from corp.evaluate.tasks.coding import MBPP, HumanEval
from corp.evaluate.tasks.countdown import Countdown
from corp.evaluate.tasks.gsm8k import GSM8K
from corp.evaluate.tasks.heldout import apply_pool_options, dev_pool
from corp.evaluate.tasks.jsonl import JsonlTask
from corp.evaluate.tasks.math500 import Math500
from corp.evaluate.tasks.prior import label_prior
from corp.evaluate.tasks.reorder import Reorder
from corp.evaluate.tasks.rg import ReasoningGymTask, rg_datasets
from corp.registry import Registry

# --task NAME[:...] -> its Task class; the class's from_spec reads what follows the name
TASKS: Registry[type[Task]] = Registry("task", unknown="unknown task '{name}'; known: {known} (see `corp tasks`)")
for _name, _cls in (
    ("arith", Arith),
    ("countdown", Countdown),
    ("gsm8k", GSM8K),
    ("math500", Math500),
    ("mbpp", MBPP),
    ("humaneval", HumanEval),
    ("reorder", Reorder),
    ("jsonl", JsonlTask),
    ("csv", JsonlTask),
    ("parquet", JsonlTask),
    ("rg", ReasoningGymTask),
):
    TASKS.register(_name, _cls)


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
    task, gen = TASKS.lookup(name).from_spec(spec, rest, data_dir)
    return apply_pool_options(_apply_generation_options(task, spec, gen), spec, gen)


def list_tasks() -> list[dict]:
    """One row per task ({'task', 'description'}); reasoning-gym's datasets when it is installed,
    else one row saying how to install it."""
    rows = [
        {"task": n, "description": c.description}
        for n, c in sorted(TASKS.items())
        if c not in (JsonlTask, ReasoningGymTask)
    ]
    rows.append({"task": "jsonl:PATH", "description": JsonlTask.description})
    rows.append(
        {
            "task": "(any task)",
            "description": "generation options: max_new_tokens=N, stop=S1|S2 (e.g. arith:max_new_tokens=12,stop=\\n); "
            "held-out pools: heldout=START,dev=N[,select=M] (e.g. arith:pool=6000,heldout=4000,dev=400)",
        }
    )
    gym = rg_datasets()
    if gym:
        for ds, desc in gym.items():
            rows.append({"task": f"rg:{ds}", "description": f"reasoning-gym: {desc}"})
    else:
        rows.append(
            {
                "task": "rg:NAME",
                "description": (
                    "reasoning-gym's ~100 procedural datasets: not installed; pip install 'corp[reasoning-gym]'"
                ),
            }
        )
    return rows


__all__ = [
    "SPLITS",
    "Example",
    "SplitSizes",
    "Task",
    "TASKS",
    "dev_pool",
    "get_task",
    "label_prior",
    "list_tasks",
    "make_splits",
]
