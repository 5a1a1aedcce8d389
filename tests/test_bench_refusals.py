"""Issue 57's bench cases: what a bench config or a results directory gets wrong is one line before
anything is computed or written, and --report-only keeps the outputs' provenance."""

from __future__ import annotations

import json

import pytest

from corp.bench.config import BenchConfig
from corp.config import load_config
from corp.errors import CorpError
from tests.test_bench import tiny_options


def _cfg(tiny_dir, root, **over) -> BenchConfig:
    base = dict(seeds=[1], settings=["paper"], compare=[], methods={"self-consistency": {"options": {"k": [1]}}})
    return load_config(BenchConfig, None, tiny_options(tiny_dir, root, **{**base, **over}))


def test_a_budget_given_twice_is_refused(tiny_dir, tmp_path):
    with pytest.raises(CorpError, match=r"budgets repeat 3e\+08; give each budget once"):
        _cfg(tiny_dir, tmp_path, budgets=[3e8, 3e8])
    with pytest.raises(CorpError, match="budgets repeat"):
        _cfg(tiny_dir, tmp_path, budgets=[1e8, 3e8, 3.0e8])


def test_a_refused_bench_config_leaves_no_results_directory(tiny_dir, tmp_path):
    """The check that fails is one only the plan can make (a method option), after the results directory was made."""
    from corp.bench.sweep import run_bench

    cfg = _cfg(tiny_dir, tmp_path, methods={"self-consistency": {"options": {"k": [1], "no_such_option": 3}}})
    with pytest.raises(CorpError, match="no_such_option|no-such-option"):
        run_bench(cfg, "corp bench", load_model=False)
    assert not (tmp_path / "results").exists(), list((tmp_path / "results").rglob("*"))


@pytest.mark.parametrize("text", ['{"note": "mine"}', "[1, 2]", '"a string"'])
def test_a_cell_file_that_parses_but_is_no_cell_record_is_refused_and_kept(tiny_dir, tmp_path, text):
    """A truncated record was refused; one that parsed but was no record was rerun and written over."""
    from corp.bench.sweep import Bench, plan, run_bench

    cfg = _cfg(tiny_dir, tmp_path)
    (cell,) = plan(cfg)[0]
    path = Bench(cfg).record_path(cell)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(CorpError, match=rf"bench record '.*{path.name}' is damaged \(.*\); move it aside"):
        run_bench(cfg, "corp bench")
    assert path.read_text() == text, "the user's file was overwritten"
    assert not (tmp_path / "work").exists(), "a cell ran"


def test_report_only_keeps_the_recorded_made_by_line(tiny_dir, tmp_path):
    from corp.bench.sweep import run_bench

    cfg = _cfg(tiny_dir, tmp_path)
    run_bench(cfg, "corp bench --config b.yaml --threads 1")
    out = tmp_path / "results" / "tiny"
    made = "Made by `corp bench --config b.yaml --threads 1`"
    assert made in (out / "table.md").read_text()
    run_bench(cfg, "corp bench --config b.yaml", compute=False)  # --report-only without --threads 1
    assert made in (out / "table.md").read_text()
    assert json.loads((out / "bench.json").read_text())["command"] == "corp bench --config b.yaml --threads 1"
