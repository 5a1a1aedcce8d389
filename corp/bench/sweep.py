"""`corp bench`: the matched-compute sweep over the method registry.

Every (task, data setting, seed, method variant, budget) is a cell. The sweep reads each method's
`BenchAdapter` (corp.method; its `Method.bench`, in the method's own module) and never asks which method it
runs: fixed cells run once per seed, population cells read the largest prefix of the seed's shared
scored population that fits the budget with the method's own evaluations (one `corp score` run per
seed, split sizes and noise scheme, mixing the bench's sigmas, serves every trial and every method
on those splits; a final cell whose `from_sigmas` is set reads one of exactly those scales),
iterative cells resume one training run per seed and grow it to its last checkpoint within each
budget; no cell spends more than its budget. Each cell runs the registered method on its own run
directory (WORK_DIR/NAME/...), so an interrupted cell resumes through the run layer's cache, and a
finished cell leaves a record (RESULTS_DIR/NAME/cells/*.json: its rows, per-example test outcomes,
FLOPs used, chosen options), so it is never rerun.

Everything that can be checked without generating is checked first (unknown methods, options,
split sizes, budgets below a method's minimum, the results directory), one error line each.
"""

from __future__ import annotations

import json

from corp.bench.cells import Bench
from corp.bench.config import BENCH_PROTOCOL, BenchConfig, results_path
from corp.bench.plan import Cell, plan, with_every_trial
from corp.bench.preflight import preflight
from corp.bench.protocol import check_registration
from corp.bench.report import write_outputs
from corp.bench.retention import score_records
from corp.bench.schedule.passes import run_passes
from corp.bench.schedule.ray_cells import run_cells_on_ray
from corp.config import load_config
from corp.errors import CorpError
from corp.runtime.runs import read_json


def run_bench(
    cfg: BenchConfig,
    command: str = "corp bench",
    load_model: bool = True,
    compute: bool = True,
    only_task: str | None = None,
    only_methods: list[str] | None = None,
) -> dict:
    """Plan, check, run every cell (skipping finished ones), write the outputs; returns a summary.
    `compute=False`: write the outputs from the cells finished so far, running nothing (the table
    says how many cells are still to run). `only_task`: compute only that task's cells (the
    others' finished records still go into the outputs), so one process per task can share a bench.
    `only_methods`: compute only the cells of these methods (a variant's label, e.g. `corp-r4`, or a
    registry name, which takes all its variants), so processes can split one task's methods. Any
    number of processes may also run the same cells: each claims a cell before running it
    (corp.bench.schedule), skips the ones another holds and repeats its pass until none is held.
    `executor: ray` runs the cells as Ray tasks first (corp.bench.schedule.ray_cells); the passes
    then find their records."""

    cells, missing = plan(cfg)
    only_task = _check_selection(cfg, cells, missing, only_task, only_methods)
    preflight(cfg, with_every_trial(cells), load_model=load_model and compute)
    # the pre-registration (corp.bench.protocol): stored before the first final cell, refused once changed after
    check_registration(cfg, results_path(cfg), compute)
    bench = Bench(cfg)
    bench.cells = cells

    def mine(cell: Cell) -> bool:
        return only_task in (None, cell.task) and (
            not only_methods or bool({cell.label, cell.method} & set(only_methods))
        )

    def mine_record(rec: dict) -> bool:
        return only_task in (None, rec["task"]) and (
            not only_methods or bool({rec["label"], rec["method"]} & set(only_methods))
        )

    done_before = sum(
        1 for c in cells if (r := bench.resolve(c, cells)) is not None and bench.load_record(r) is not None
    )
    older = old_protocol_records(cfg)
    current = any(bench.load_record(r) for c in cells if (r := bench.resolve(c, cells)) is not None)
    if not compute and older and not current:
        # the first edition's outputs stay as the version that ran them wrote them
        # (this corp would write an empty report over them)
        raise CorpError(
            f"{bench.out} holds {len(older)} cell record(s) of an older bench protocol "
            f"({', '.join(sorted(set(older.values())))}; this corp runs protocol {BENCH_PROTOCOL}) "
            f"and none of protocol {BENCH_PROTOCOL}: its table.md, results.csv and plots are kept as written; "
            f"rerun the bench to compute protocol-{BENCH_PROTOCOL} cells beside them, "
            "or report with the commit that ran them"
        )
    if compute and cfg.executor == "ray":  # every cell a Ray task; the passes below then find their records
        run_cells_on_ray(bench, cells, mine)
    done = run_passes(cfg, bench, cells, compute, mine)
    if cfg.retention and compute:  # the rest: cells another process finished, or Ray's (corp.bench.retention)
        score_records(cfg, {n: r for n, r in done.items() if mine_record(r)})
    records = list(done.values())
    tuning = [r for r in records if r["setting"] == "tune"]
    records = [r for r in records if r["setting"] != "tune"]
    n_final = sum(c.setting != "tune" for c in cells)
    if not compute:  # --report-only rewrites the outputs of cells another command ran: its "Made by" stays
        command = recorded_command(cfg) or command
    summary = write_outputs(
        cfg, records, missing, command, not_run=n_final - len(records), tuning=tuning, older=len(older)
    )
    summary.update(
        cells=len(cells), reused=done_before, method_calls=bench.calls, not_run=len(cells) - len(records) - len(tuning)
    )
    return summary


def _check_selection(cfg: BenchConfig, cells: list[Cell], missing: list[dict], only_task, only_methods):
    """--task and --methods checked against the plan; --task's label resolved to its spec."""
    by_label = {cfg.label(t): t for t in cfg.tasks}
    only_task = by_label.get(only_task, only_task)  # --task takes a task's spec or its label
    if only_task is not None and only_task not in cfg.tasks:
        raise CorpError(f"--task {only_task!r} is not a task of {cfg.name}; its tasks (labels): {', '.join(by_label)}")
    if only_methods is not None:
        known = {c.label for c in cells} | {c.method for c in cells}
        skipped = {m["method"]: m["reason"] for m in missing}
        if not only_methods:
            raise CorpError("--methods names no method; give variant labels or registry names, comma-separated")
        named = [m for m in only_methods if m in skipped]
        if named:
            raise CorpError(f"--methods {named[0]}: {cfg.name} does not run it ({skipped[named[0]]})")
        unknown = [m for m in only_methods if m not in known]
        if unknown:
            raise CorpError(
                f"--methods {','.join(unknown)}: not a method of {cfg.name}; its methods (variant labels): "
                f"{', '.join(sorted({c.label for c in cells}))}"
            )
    return only_task


def recorded_command(cfg: BenchConfig) -> str | None:
    """The command bench.json says made the outputs (the one that ran the cells); None when there is none."""
    path = results_path(cfg) / "bench.json"
    try:
        command = json.loads(path.read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) and command else None


def old_protocol_records(cfg: BenchConfig) -> dict[str, str]:
    """{record file name: its protocol} for the records in the bench's cells directory made under
    another bench protocol (kept, never reused or reported)."""
    cells_dir = results_path(cfg) / "cells"
    out = {}
    for path in sorted(cells_dir.glob("*.json")) if cells_dir.is_dir() else []:
        protocol = read_json(path).get("bench_protocol", 1)  # the first edition's records name none
        if protocol != BENCH_PROTOCOL:
            out[path.name] = f"protocol {protocol}"
    return out


def load_bench_config(path: str, overrides: dict | None = None) -> BenchConfig:
    return load_config(BenchConfig, path, overrides or {})
