"""benchmarks/every_method.py's pure parts (issue 54: every method at real size, once): the runs it plans
are valid options of every registered method, a refusal is read from corp's `error:` line, units and
their seconds come from a run's own rows, resume skips only what finished with the same options, and
the table shows both backends with a note per run that did not succeed. Its process handling: memory
summed over a process tree, a run stopped at its time limit."""

from __future__ import annotations

import json
import os
import sys

import pytest

from corp.config import load_config
from corp.methods import METHODS, REGISTRY
from tests.benchmark_scripts import load

em = load("every_method")


@pytest.mark.filterwarnings("ignore:--n-:UserWarning")  # consolidate's warnings on its few probe/validation examples
def test_every_registered_method_is_planned_with_options_its_config_accepts():
    jobs = em.jobs("qwen2.5-coder-1.5b", "smollm2-135m", 5.7e-4, "arith")
    assert {j.method for j in jobs} == {m.name for m in METHODS}
    assert [j.label for j in jobs if j.method == "grpo"] == ["grpo", "grpo-cov", "grpo-reco", "grpo-full"]
    by = {j.label: j.options for j in jobs}
    assert by["grpo"]["lora_r"] > 0 and by["grpo-full"]["lora_r"] == 0 and by["grpo-cov"]["loss"] == "cov"
    assert by["ftis"]["nodes"] == "qwen2.5-coder-1.5b,smollm2-135m"
    assert by["es"]["iterations"] == 1 and by["fgrpo"]["rounds"] == 1 and by["fgrpo"]["clients"] == 2
    for j in jobs:
        load_config(REGISTRY[j.method].config, None, j.options)  # a CorpError here: the sizes went stale
        assert j.options["model"] == "qwen2.5-coder-1.5b" and j.options["task"] == "arith"


def test_the_command_is_the_backends_venv_corp_with_the_methods_flags(tmp_path):
    job = next(j for j in em.jobs("m", "p", 1e-3, "arith") if j.label == "es")
    cmd = em.command(job, "vllm", tmp_path / "run", ["--threads", "2"])
    assert cmd[0].endswith(".venv-vllm/bin/corp") and cmd[1] == "es"
    assert cmd[cmd.index("--population-per-iteration") + 1] == "2"  # the config's option name, not the field's
    assert cmd[-4:] == ["--output-dir", str(tmp_path / "run"), "--threads", "2"]
    assert cmd[cmd.index("--backend") + 1] == "vllm"


def test_a_recorded_command_names_no_path_of_the_machine_that_ran_it(tmp_path):
    """Planted (2026-12-07: two reruns recorded the checkout's absolute venv path and the absolute work folder)."""
    job = next(j for j in em.jobs("m", "p", 1e-3, "arith") if j.label == "es")
    work = tmp_path / "em"
    text = em.shown(" ".join(em.command(job, "vllm", work / "es-vllm", [])), work)
    assert text.startswith(".venv-vllm/bin/corp es ") and "--output-dir WORK/es-vllm" in text
    assert str(tmp_path) not in text and str(em.ROOT) not in text
    assert em.shown(str(work / "es-vllm.log"), work) == "WORK/es-vllm.log"


def test_a_refusal_is_corps_last_error_line():
    out = "run directory: /x\n 50%|#####     | 1/2 [00:01<00:01]\nerror: the test split is empty; set --n-test >= 1\n"
    assert em.refusal(out) == "the test split is empty; set --n-test >= 1"
    assert em.refusal("error: first try failed\nerror: the last word\n") == "the last word"
    assert em.refusal("Traceback (most recent call last):\nRuntimeError: boom\n") is None
    assert em.status(2, None, "the test split is empty") == "refused"
    assert em.status(2, None, None) == "failed"  # exit 2 without corp's line: not a refusal
    assert em.status(1, None, None) == "failed" and em.status(0, None, None) == "ok"
    assert em.status(-15, "out of memory", None) == "out of memory"


def _jsonl(path, rows, partial=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + ('{"kind": "spec' if partial else ""))


def test_units_and_their_seconds_come_from_the_runs_own_rows(tmp_path):
    spec = {"kind": "specialist", "seconds": 2.0, "apply_seconds": 0.5, "reward_seconds": 0.5}
    _jsonl(tmp_path / "pop" / "population.jsonl", [spec, spec, {"kind": "base", "seconds": 9.0}], partial=True)
    assert em.unit_seconds("specialist", tmp_path / "pop") == (2, 6.0)
    # F-TIS: one row per node per step of each arm; a unit is an arm's step
    rows = [{"arm": a, "node": n, "step": 1, "seconds": 1.0} for a in ("ftis", "grpo") for n in (0, 1)]
    _jsonl(tmp_path / "ftis" / "metrics.jsonl", rows)
    assert em.unit_seconds("arm step", tmp_path / "ftis") == (2, 4.0)
    _jsonl(tmp_path / "es" / "metrics.jsonl", [{"iteration": 1, "seconds": 3.0}])
    assert em.unit_seconds("iteration", tmp_path / "es") == (1, 3.0)
    for c in (0, 1):
        direction = {"kind": "direction", "split": "support", "seconds": 1.0}
        _jsonl(tmp_path / "fed" / "clients" / str(c) / "evals.jsonl", [direction, {**direction, "split": "probe"}])
    assert em.unit_seconds("client specialist", tmp_path / "fed") == (2, 2.0)
    _jsonl(tmp_path / "ev" / "evals.jsonl", [{"split": "test", "n": 1, "seconds": 1.0}, {"split": "test", "n": 2}])
    assert em.unit_seconds("test pass", tmp_path / "ev") == (3, 1.0)
    _jsonl(tmp_path / "fg" / "rounds.jsonl", [{"round": 1}])
    assert em.unit_seconds("round", tmp_path / "fg") == (1, None)  # no seconds: the record divides the wall
    assert em.unit_seconds("specialist", tmp_path / "nothing") == (0, 0)


def _rec(label, backend, status, options, **kw):
    base = {"label": label, "method": label, "backend": backend, "status": status, "options": options, "rc": 0}
    base.update({"refusal": None, "wall_s": 60.0, "unit": "step", "units": 1, "s_per_unit": 30.0})
    base.update({"unit_source": "rows", "peak_anon_gb": 1.0, "peak_rss_gb": 2.0, **kw})
    return base


def test_resume_skips_only_runs_finished_with_the_same_options():
    a, b, c = em.Job("a", "a", {"x": 1}), em.Job("b", "b", {"x": 1}), em.Job("c", "c", {"x": 1})
    records = {
        "a/hf": _rec("a", "hf", "ok", {"x": 1}),
        "a/vllm": _rec("a", "vllm", "refused", {"x": 1}),
        "b/hf": _rec("b", "hf", "failed", {"x": 1}),  # failed: run again
        "b/vllm": _rec("b", "vllm", "out of memory", {"x": 1}),  # a result: kept
        "c/hf": _rec("c", "hf", "ok", {"x": 2}),  # other options: run again
    }
    got = em.to_run([a, b, c], ["hf", "vllm"], records, redo=False)
    assert got == [("b", "hf"), ("c", "hf"), ("c", "vllm")]
    assert len(em.to_run([a, b, c], ["hf", "vllm"], records, redo=True)) == 6
    # and the record survives the file: saved, loaded, the same decisions
    assert em.to_run([a], ["hf"], json.loads(json.dumps(records)), redo=False) == []


def test_the_table_shows_each_backend_and_notes_what_did_not_succeed():
    jobs = [em.Job("grpo", "grpo", {}), em.Job("fgrpo", "fgrpo", {}), em.Job("fera", "fera", {})]
    records = {
        "grpo/hf": _rec("grpo", "hf", "ok", {}, s_per_unit=41.26, units=1, wall_s=180.4),
        "grpo/vllm": _rec("grpo", "vllm", "refused", {}, rc=2, refusal="needs 28 GB; use --lora-r 8"),
        "fgrpo/hf": _rec("fgrpo", "hf", "ok", {}, unit="round", s_per_unit=300.0, unit_source="wall"),
        "fgrpo/vllm": _rec("fgrpo", "vllm", "out of memory", {}, why="stopped at 1.2 GB available"),
    }
    text = em.table(records, jobs, ["hf", "vllm"])
    lines = text.splitlines()
    assert lines[0].count("|") == 2 + 4 * 2 + 1  # method, unit, then four columns per backend
    grpo = next(ln for ln in lines if ln.startswith("| grpo |"))
    assert "| step | ok | 41.3 (1) | 180 | 1.0 / 2.0 | refused |" in grpo
    assert "300.0 (1) wall" in next(ln for ln in lines if ln.startswith("| fgrpo |"))
    assert "| fera | round | not run |" in text
    assert "- grpo on vllm: refused: needs 28 GB; use --lora-r 8" in lines
    assert "- fgrpo on vllm: out of memory: stopped at 1.2 GB available" in lines


def test_the_expected_time_is_start_up_plus_units_at_the_measured_rate():
    records = {
        "score/hf": _rec("score", "hf", "ok", {}, unit="specialist", units=2, s_per_unit=20.0, wall_s=100.0),
        "es/vllm": _rec("es", "vllm", "ok", {}, unit="iteration", units=1, s_per_unit=50.0, wall_s=400.0),
    }
    randopt = em.Job("randopt", "randopt", {"population": 3})
    assert em.expected_s(randopt, "hf", records) == 60.0 + 3 * 20.0  # start-up: 100 - 2 x 20
    es = em.Job("es", "es", {"iterations": 1})
    assert em.expected_s(es, "hf", records) == 400.0  # no iteration rate on hf: what it took on vllm
    # a rate of wall / units (FGRPO's rounds) holds its start-up: not a rate to add a start-up to
    records["fgrpo/hf"] = _rec("fgrpo", "hf", "ok", {}, unit="round", s_per_unit=300.0, unit_source="wall")
    assert em.expected_s(em.Job("fera", "fera", {"rounds": 1}), "hf", records) is None


def test_a_process_trees_memory_counts_its_children_and_a_run_is_stopped_at_its_limit(tmp_path):
    import subprocess
    import time

    own, _ = em.tree_memory(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(300_000_000); import time; time.sleep(60)"])
    try:
        for _ in range(100):  # until the child holds its 0.3 GB
            anon, rss = em.tree_memory(os.getpid())
            if anon - own > 0.25:
                break
            time.sleep(0.1)
        assert anon - own > 0.25 and anon <= rss
    finally:
        child.kill()
        child.wait()
    res = em.run_tree([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log", 0.0, 0.001)
    assert res["stopped"] == "timed out" and res["rc"] != 0 and res["wall_s"] < 30


def test_a_rerun_on_one_backend_keeps_the_other_backends_columns(tmp_path, monkeypatch):
    """Planted: every-method.json holds hf and vllm records, and a rerun asks for hf alone (as
    `--backends hf --methods analyze-rank --redo` did): the table must still show vllm's columns; `--table-only`
    renders both from the JSON without running anything (the old script wrote the asked backends' only)."""
    records = {
        "grpo/hf": _rec("grpo", "hf", "ok", {}, s_per_unit=41.26, units=1, wall_s=180.4),
        "grpo/vllm": _rec("grpo", "vllm", "refused", {}, rc=2, refusal="needs 28 GB"),
    }
    assert em.recorded_backends(records, ["hf"]) == ["hf", "vllm"]
    (tmp_path / "every-method.json").write_text(json.dumps(records))
    monkeypatch.setattr(sys, "argv", ["every_method.py", "--out", str(tmp_path), "--table-only"])
    monkeypatch.setattr(em, "run_one", lambda *a, **k: pytest.fail("--table-only ran a method"))
    em.main()
    head = (tmp_path / "README-table.md").read_text().splitlines()[0]
    assert head.count("|") == 2 + 4 * 2 + 1, head
