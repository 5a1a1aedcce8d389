"""The bench's local passes (corp.bench.schedule.passes) say what the cells still to run will take."""

from __future__ import annotations

import re
from types import SimpleNamespace

import corp.bench.schedule.passes as passes


def _cell(name: str, task: str = "arith"):
    return SimpleNamespace(
        task=task,
        task_label=task,
        setting="paper",
        seed=0,
        label=name,
        method=name,
        budget=None,
        record_name=lambda: name,
    )


class _Bench:
    """What run_passes asks of a Bench: every cell resolved as itself, records by name, method calls."""

    def __init__(self, done=()):
        self.calls, self.records = 0, {name: {"setting": "paper"} for name in done}

    def resolve(self, cell, cells):
        return cell

    def load_record(self, cell):
        return self.records.get(cell.record_name())


def test_the_bench_says_its_cells_to_go_after_the_first_it_runs(monkeypatch, capsys):
    """A bench is hours of cells with one bar (issue 56): after the first cell this process runs, one line says
    how many of its own cells are left (not the finished ones, not another task's) and the time at that rate."""

    def attempt(bench, cell):  # runs the cell: one method call, its record written
        bench.calls += 1
        bench.records[cell.record_name()] = {"setting": "paper"}
        return bench.records[cell.record_name()]

    monkeypatch.setattr(passes, "attempt", attempt)
    monkeypatch.delenv("CORP_NO_PROGRESS", raising=False)
    cells = [_cell("a"), _cell("b"), _cell("c"), _cell("d", task="other"), _cell("e"), _cell("f")]
    bench = _Bench(done=("a", "f"))  # finished before: a (so b is the first to run) and f (so not to go)
    cfg = SimpleNamespace(name="b1", retention=False)
    done = passes.run_passes(cfg, bench, cells, True, lambda c: c.task == "arith")
    assert set(done) == {"a", "b", "c", "e", "f"} and bench.calls == 3
    said = [line for line in capsys.readouterr().err.splitlines() if " to go, about " in line]
    assert len(said) == 1 and re.match(
        r"bench b1: 2 cells to go, about \d+ s \(.* s each, as the first cell took; cells of other methods", said[0]
    ), said  # c and e
