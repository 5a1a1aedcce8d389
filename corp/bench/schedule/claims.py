"""Claims: which process computes a cell. A claim is an flock on WORK_DIR/NAME/claims/CELL.lock,
released when the process ends (a killed process leaves no stale claim), so any number of `corp
bench` processes and Ray tasks may share one bench: each runs the cells no other holds."""

from __future__ import annotations

from pathlib import Path

from corp.bench.cells import Bench
from corp.bench.plan import Cell
from corp.bench.records import CellRecord
from corp.errors import RunBusy
from corp.method import ITERATIVE
from corp.runtime.runs import try_flock


def claim_path(bench: Bench, cell: Cell) -> Path:
    """A cell's claim file; an iterative cell's is its run's (every budget continues one training
    run, so one process takes them all, in order)."""
    name = bench._run_dir(cell).name if cell.adapter.kind == ITERATIVE else cell.record_name()
    return bench.work / "claims" / f"{name}.lock"


def busy(bench: Bench, cell: Cell) -> bool:
    """Whether another process holds the cell's claim (it is computing it now)."""
    path = claim_path(bench, cell)
    if not path.exists():
        return False
    with open(path, "a+") as fh:
        return not try_flock(fh)


def attempt(bench: Bench, cell: Cell) -> CellRecord | None:
    """Run the cell unless another process holds it: its claim or a run directory it needs
    (RunBusy, e.g. a shared population being scored). None: deferred to a later pass."""
    path = claim_path(bench, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        if not try_flock(fh):
            return None
        try:
            return bench.run_cell(cell)  # re-reads the record first: another process may have finished it
        except RunBusy:
            return None
