"""The bench's typed records (corp/bench/records.py): every committed cell record and comparison, of
every edition, is what its type says; a record that is not is refused when the bench writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corp.bench.records import CellRecord, Comparison, check_record
from corp.errors import CorpError

REPO = Path(__file__).resolve().parents[1]
RECORDS = sorted((REPO / "results").glob("*/cells/*.json"))
BENCHES = sorted((REPO / "results").glob("*/bench.json"))


def test_every_committed_cell_record_is_a_cell_record():
    assert len(RECORDS) > 300  # every edition's cells (bench-cpu, -cpu-2, -cpu-3, -noise, -smoke)
    for path in RECORDS:
        check_record(json.loads(path.read_text()), CellRecord, str(path.relative_to(REPO)))


def test_every_committed_comparison_is_a_comparison():
    comps = [(p, c) for p in BENCHES for c in json.loads(p.read_text()).get("comparisons", [])]
    assert len(comps) > 20
    for path, c in comps:
        check_record(c, Comparison, f"a comparison in {path.relative_to(REPO)}")


def _a_record() -> dict:
    return json.loads(next(p for p in RECORDS if "corp-stage1" in p.name).read_text())


def test_a_renamed_missing_or_mistyped_field_is_named():
    rec = _a_record()
    rec["wallseconds"] = rec.pop("wall_seconds")
    with pytest.raises(CorpError, match="missing 'wall_seconds'.*and 1 more.*needs its line"):
        check_record(rec)
    rec = _a_record()
    rec["seed"] = "0"
    with pytest.raises(CorpError, match="'seed' is str"):
        check_record(rec)
    rec = _a_record()
    rec["rows"][0]["correct"] = [1, "0"]  # a row's field, checked through its own type
    with pytest.raises(CorpError, match=r"rows\[0\]: 'correct' is list"):
        check_record(rec)
    rec = _a_record()
    rec["budget"] = None  # optional where the type says so (a fixed method's one cell)
    check_record(rec)


def test_the_bench_refuses_to_write_a_record_that_is_not_a_cell_record(tmp_path, monkeypatch):
    from corp.bench import cells
    from corp.bench.plan import plan
    from corp.bench.sweep import load_bench_config

    cfg = load_bench_config(REPO / "configs" / "bench-smoke.yaml")
    cfg.results_dir, cfg.work_dir = str(tmp_path / "results"), str(tmp_path / "work")
    cell = next(c for c in plan(cfg)[0] if c.method == "self-consistency")
    bench = cells.Bench(cfg)
    planted = {**_a_record(), "accuracy": 0.5}  # a field the record type does not have
    monkeypatch.setattr(cells.Bench, "_fixed", lambda self, c: planted)
    with pytest.raises(CorpError, match="unknown field 'accuracy'"):
        bench.run_cell(cell)
    assert not bench.record_path(cell).exists()
