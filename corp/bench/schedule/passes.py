"""The local schedule: passes over the plan. A cell another process holds (its claim, or a run
directory it needs) or a final whose trials another process is running is deferred, and the pass is
repeated after CORP_BENCH_WAIT seconds until none is; one process alone runs everything in its
first pass."""

from __future__ import annotations

import os
import time

from tqdm.auto import tqdm

from corp.bench.cells import Bench
from corp.bench.config import BenchConfig
from corp.bench.plan import Cell, trials_of
from corp.bench.retention import score_records
from corp.bench.schedule.claims import attempt, busy
from corp.runtime.ledger import say_expected
from corp.runtime.progress import progress_disabled


def run_passes(cfg: BenchConfig, bench: Bench, cells: list[Cell], compute: bool, mine) -> dict[str, dict]:
    """Every cell's record, by record name: finished ones read, this process's own (`mine`) run."""
    # Why several local processes still share a bench through claims (flocks) and passes, beside
    # --executor ray, which is the parallel path: Ray is an optional extra, and the long CPU benches run
    # as one `benchmarks/bench_run.sh` wrapper per task (a retry loop that commits each finished cell),
    # where a core freed by a finished task joins a slower one with a second wrapper on that task. The
    # claims are also what keeps a Ray bench and a local process on one results directory from running
    # a cell twice (a Ray task claims its cell the same way).
    wait = float(os.environ.get("CORP_BENCH_WAIT", "30"))
    done: dict[str, dict] = {}
    n_pass = 0
    said = False
    while True:
        n_pass += 1
        deferred = 0
        bar = tqdm(
            cells,
            desc=f"bench {cfg.name}" + (f" (pass {n_pass})" if n_pass > 1 else ""),
            unit="cell",
            initial=0,
            dynamic_ncols=True,
            disable=progress_disabled() or not compute,
        )
        for i, planned in enumerate(bar):
            bar.set_postfix_str(
                f"{planned.task_label or planned.task} {planned.setting} s{planned.seed} {planned.label} "
                f"{'' if planned.budget is None else f'{planned.budget:.2g}'}"
            )
            calls, t0 = bench.calls, time.perf_counter()
            deferred += _pass_cell(cfg, bench, cells, planned, compute, mine, done)
            if bench.calls > calls and not said:  # the first cell this process ran: what the rest will take
                said = True
                _say_cells_left(cfg, bench, cells[i + 1 :], cells, mine, time.perf_counter() - t0)
        bar.close()
        if not deferred:
            break
        time.sleep(wait)
    return done


def _say_cells_left(cfg: BenchConfig, bench: Bench, rest: list[Cell], cells: list[Cell], mine, seconds: float) -> None:
    """One line after the first cell this process ran: its own cells still to run (no record yet) and their
    time at that cell's rate, which is rough: cells of other methods and budgets differ (issue 56)."""
    if progress_disabled():  # reading the records is not worth it for a line nobody sees
        return
    left = sum(1 for c in rest if mine(c) and ((r := bench.resolve(c, cells)) is None or bench.load_record(r) is None))
    basis = "as the first cell took; cells of other methods and budgets differ"
    say_expected(f"bench {cfg.name}", left, "cells", seconds, basis=basis)


def _pass_cell(
    cfg: BenchConfig, bench: Bench, cells: list[Cell], planned: Cell, compute: bool, mine, done: dict
) -> int:
    """One planned cell in a pass of `run_passes`: its record read, or run if it is this process's own, into
    `done`; returns 1 when it is deferred (another process holds it or its trials), else 0."""
    cell = bench.resolve(planned, cells)  # None: its trials have not all run
    if cell is None:
        if compute and mine(planned) and any(busy(bench, t) for t in trials_of(planned, cells)):
            return 1
        return 0
    name = cell.record_name()
    if name in done:
        return 0
    own = compute and mine(cell)
    rec = bench.load_record(cell)  # a finished cell needs no claim
    if rec is None and own:
        rec = attempt(bench, cell)
    if rec is not None and own and cfg.retention and rec.get("setting") != "tune":
        # scored now, while the cell's saved model is on disk: a long bench spans sessions whose run
        # directories (git-ignored) are gone when a later one resumes. That holds for a cell finished
        # by an earlier start that stopped before scoring it too: scored when first seen, not after
        # the passes, which a session may not reach (a record already scored costs one stat)
        score_records(cfg, {name: rec})
    if rec is not None:
        done[name] = rec
    elif own:
        return 1
    return 0
