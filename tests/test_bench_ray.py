"""`corp bench --executor ray` (issue 37): the cells as Ray tasks on a local loopback Ray give the local
run's cell records and outputs, byte for byte apart from the timing fields.

Timing fields, the only ones excluded: a record's `wall_seconds`, `wall_seconds_increment` (an iterative
cell's share of its run) and `population_seconds` (the scoring time of the specialists a population
cell read), and a population row's wall-clock fields (`corp.runtime.context.TIMING_FIELDS`: `seconds`,
`apply_seconds`, `reward_seconds`, and on vllm `noise_seconds` and `push_seconds`). They reach the outputs as
results.csv's wall_seconds and population_seconds columns and table.md's time per method, so the
outputs are compared after the Ray records' timing fields are set to the local run's and both are
rewritten by `--report-only` (the outputs are a function of the records); the Ray run's own outputs
are checked to be what `--report-only` writes from its records.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")

from corp.bench.config import BenchConfig  # noqa: E402
from corp.config import load_config  # noqa: E402
from corp.runtime.context import TIMING_FIELDS  # noqa: E402
from corp.runtime.runs import read_jsonl  # noqa: E402
from tests.test_bench import tiny_options  # noqa: E402
from tests.test_methods import text_checksum  # noqa: E402

TIMING = ("wall_seconds", "wall_seconds_increment", "population_seconds")
ROW_TIMING = TIMING_FIELDS
OUTPUTS = ("results.csv", "table.md", "bench.json")


def dies_once_in_a_ray_task(completions, **kw):
    """The tests' reward (text_checksum), except that its first call inside a Ray task (not an actor) while
    CORP_TEST_DIE_ONCE names a file not yet there ends the task's worker process, as a kill would: Ray
    must rerun that cell, which must leave no half record and resume to the local run's."""
    marker = os.environ.get("CORP_TEST_DIE_ONCE")
    if marker and not os.path.exists(marker) and ray.is_initialized():
        context = ray.get_runtime_context()
        if context.worker.mode == ray.WORKER_MODE and context.get_actor_id() is None:
            Path(marker).write_text(f"{os.getpid()}\n")
            os._exit(1)
    return text_checksum(completions, **kw)


def _options(tiny_dir: Path, root: Path, **over) -> dict:
    methods = {
        "self-consistency": {"options": {"k": [1, 2]}},  # fixed: one cell per seed, both settings in one run dir
        "randopt": {
            "options": {"top_k": [1, 2]},
            "variants": {"randopt": {}, "randopt-raced": {"race": "halving", "race_first": 2}},
        },
        # a population cell's first try is sized by its predecessor's record (the previous seed's)
        "consolidate": {"options": {"alphas": [1, 2], "gate_z": -10.0}, "variants": {"corp-stage1": {"rounds": 0}}},
        "es": {"options": {"population": 2, "sigma": 0.05, "alpha": 0.05}},  # iterative: budgets grow one run
        "grpo": {"skip": "not in this test"},
        "ftis": {"skip": "not in this test"},
    }
    opts = tiny_options(
        tiny_dir,
        root,
        methods=methods,
        compare=[["corp-stage1", "base"], ["corp-stage1", "randopt-top1"]],
        settings=["paper", "equal-data"],
        reward="tests.test_bench_ray:dies_once_in_a_ray_task",
        population=8,  # one `corp score` call per shared population (each starts its actors)
    )
    opts.update(over)
    return opts


def _records(root: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((root / "results" / "tiny" / "cells").glob("*.json"))}


def _untimed(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in TIMING}


def _populations(root: Path) -> dict[str, dict]:
    out = {}
    for path in sorted((root / "work" / "tiny").glob("*__population__*/population.jsonl")):
        rows = read_jsonl(path, key="key", unique=True)
        out[path.parent.name] = {r["key"]: {k: v for k, v in r.items() if k not in ROW_TIMING} for r in rows}
    return out


def _report_only(cfg_opts: dict) -> None:
    from corp.bench.sweep import run_bench

    run_bench(load_config(BenchConfig, None, cfg_opts), "corp bench --config tiny.yaml", True, False)


@pytest.fixture(scope="module")
def both(tiny_dir, tmp_path_factory, monkeypatch_module):
    from corp.bench.sweep import Bench, run_bench

    monkeypatch_module.setenv("CORP_NO_PROGRESS", "1")
    monkeypatch_module.setenv("CORP_BENCH_WAIT", "0.5")
    root = tmp_path_factory.mktemp("bench-ray")
    # both runs in one place (the records name their run directories), then moved apart
    here = _options(tiny_dir, root / "run")
    run_bench(load_config(BenchConfig, None, here), "corp bench --config tiny.yaml")
    shutil.move(root / "run", root / "local")
    killed = root / "killed-worker"
    monkeypatch_module.setenv("CORP_TEST_DIE_ONCE", str(killed))  # Ray's processes inherit it
    assert not ray.is_initialized()
    driver_calls = []  # methods this process runs (a Ray task's are in its worker process)
    invoke = Bench._invoke
    monkeypatch_module.setattr(Bench, "_invoke", lambda self, m, o: driver_calls.append(m) or invoke(self, m, o))
    summary = run_bench(
        load_config(BenchConfig, None, {**here, "executor": "ray", "workers": 2}), "corp bench --config tiny.yaml"
    )
    assert not ray.is_initialized(), "the local Ray the bench started is stopped when it ends"
    shutil.move(root / "run", root / "ray")
    monkeypatch_module.setattr(Bench, "_invoke", invoke)
    return {
        "root": root,
        "local": {**here, "results_dir": str(root / "local" / "results")},
        "ray": {**here, "results_dir": str(root / "ray" / "results")},
        "summary": summary,
        "driver_calls": driver_calls,
        "killed": killed.exists(),
    }


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_ray_cells_write_the_local_records_apart_from_timing(both):
    assert both["killed"], "a cell task's worker process was killed (and Ray reran the cell)"
    local, on_ray = _records(both["root"] / "local"), _records(both["root"] / "ray")
    assert local and set(on_ray) == set(local)
    kinds = {r["kind"] for r in local.values()}
    assert kinds == {"fixed", "population", "iterative"}, kinds
    for name in local:
        assert _untimed(on_ray[name]) == _untimed(local[name]), name
    # the records' bytes too, once the timing fields are the same
    cells = both["root"] / "local" / "results" / "tiny" / "cells"
    for name, rec in on_ray.items():
        same = {**rec, **{k: local[name][k] for k in TIMING if k in local[name]}}
        assert json.dumps(same, indent=2) + "\n" == (cells / name).read_text(), name
    # the cells ran in Ray tasks: the driver made only the shared populations' `corp score` calls
    assert set(both["driver_calls"]) == {"score"}, both["driver_calls"]


def test_ray_scores_the_shared_populations_with_the_local_rows(both):
    local, on_ray = _populations(both["root"] / "local"), _populations(both["root"] / "ray")
    assert local and on_ray == local
    for name in on_ray:  # scored by the Ray executor (its resolved config says so), keyed as the local one
        resolved = yaml.safe_load((both["root"] / "ray" / "work" / "tiny" / name / "config.yaml").read_text())
        assert resolved["executor"] == "ray" and resolved["workers"] == 2


def test_ray_outputs_are_the_local_outputs_apart_from_timing(both, tmp_path):
    ray_root, local_root = both["root"] / "ray", both["root"] / "local"
    # the Ray run's outputs are what --report-only writes from its records
    written = {f: (ray_root / "results" / "tiny" / f).read_bytes() for f in OUTPUTS}
    _report_only(both["ray"])
    for f in OUTPUTS:
        assert (ray_root / "results" / "tiny" / f).read_bytes() == written[f], f
    # ... and with the local run's timings they are the local outputs, byte for byte
    shutil.copytree(ray_root / "results", tmp_path / "results")
    local = _records(local_root)
    for path in (tmp_path / "results" / "tiny" / "cells").glob("*.json"):
        rec = json.loads(path.read_text())
        rec.update({k: local[path.name][k] for k in TIMING if k in local[path.name]})
        path.write_text(json.dumps(rec, indent=2) + "\n")
    _report_only({**both["ray"], "results_dir": str(tmp_path / "results")})
    _report_only(both["local"])
    for f in OUTPUTS:
        assert (tmp_path / "results" / "tiny" / f).read_bytes() == (local_root / "results" / "tiny" / f).read_bytes(), f


def test_the_driver_keeps_the_order_records_depend_on(tmp_path):
    """Planted: a cell that reads an earlier cell's record (a population cell's first try is sized by
    the previous seed's, an iterative budget continues the run of the one below) is held back while
    that cell is still to run; cells of other runs are not."""
    from corp.bench.schedule.ray_cells import _blocked
    from corp.bench.sweep import Bench, plan

    cfg = load_config(BenchConfig, None, _options(Path("unused-model"), tmp_path))
    cells, _ = plan(cfg)
    bench = Bench(cfg)
    bench.cells = cells

    def cell(label, seed, budget, setting="paper"):
        return next(c for c in cells if (c.label, c.seed, c.budget, c.setting) == (label, seed, budget, setting))

    low, high = cfg.budgets
    pending = list(cells)
    # a population cell waits for the previous seed's record, never for another budget or variant
    assert _blocked(bench, cell("corp-stage1", 2, low), cell("corp-stage1", 2, low), pending, {})
    assert not _blocked(bench, cell("corp-stage1", 1, high), cell("corp-stage1", 1, high), pending, {})
    # one training run's budgets one after another; another seed's run does not wait
    assert _blocked(bench, cell("es", 1, high), cell("es", 1, high), pending, {})
    assert not _blocked(bench, cell("es", 2, low), cell("es", 2, low), pending, {})
    # a raced population races in one run directory over its budgets
    assert _blocked(bench, cell("randopt-raced", 1, high), cell("randopt-raced", 1, high), pending, {})
    # a fixed method whose split sizes are the same in both settings shares its run directory over them
    sc = cell("self-consistency", 1, None, "equal-data")
    assert _blocked(bench, sc, sc, pending, {})
    # ... and once what it waits for is done (or running elsewhere finished), it goes
    first = cell("corp-stage1", 1, low)
    rest = [c for c in pending if c is not first]
    assert not _blocked(bench, cell("corp-stage1", 2, low), cell("corp-stage1", 2, low), rest, {})
    assert _blocked(bench, cell("corp-stage1", 2, low), cell("corp-stage1", 2, low), rest, {"ref": first})


def test_a_cell_reserves_its_threads_and_bad_executor_settings_are_one_line(tmp_path, monkeypatch):
    import os as _os

    from corp.bench.schedule.ray_cells import cell_threads
    from corp.errors import CorpError

    base = _options(Path("unused-model"), tmp_path)
    monkeypatch.setattr(_os, "cpu_count", lambda: 8)
    cfg = load_config(BenchConfig, None, {**base, "threads": None, "executor": "ray", "workers": 2})
    assert cell_threads(cfg) == 4  # a local Ray: the cores over the cells at once
    assert cell_threads(load_config(BenchConfig, None, {**base, "threads": 3, "executor": "ray"})) == 3
    on_cluster = {**base, "threads": None, "executor": "ray", "ray_address": "auto"}
    assert cell_threads(load_config(BenchConfig, None, on_cluster)) == 1
    # a cell on CUDA reserves its engine's GPUs (one, or its vLLM tensor-parallel size); on the CPU none
    from dataclasses import replace

    from corp.bench.schedule.ray_cells import cell_gpus
    from corp.bench.sweep import plan

    some = plan(cfg)[0][0]
    assert cell_gpus(replace(some, opts={**some.opts, "device": "cpu", "backend": "hf"})) == 0
    assert cell_gpus(replace(some, opts={**some.opts, "device": "cuda", "backend": "hf"})) == 1
    assert cell_gpus(replace(some, opts={**some.opts, "device": "cuda", "tensor_parallel_size": 2})) == 2
    for over, names in [
        ({"executor": "dask"}, "executor 'dask'"),
        ({"executor": "ray", "workers": 0}, "workers"),
        ({"ray_address": "auto"}, "executor ray"),
    ]:
        with pytest.raises(CorpError, match=names):
            load_config(BenchConfig, None, {**base, **over})
