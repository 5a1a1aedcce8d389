"""benchmarks/bench_run.sh (issue 22): the long-run wrapper restarts a stopped bench and commits, to
git, only the finished cell records of its own task (and, at the end, the bench's outputs) and its
finished population runs, which a later start restores; never the other run directories or anything
else in the checkout; bad input is not retried. The bench itself is
a stand-in script here (a real bench is exercised by hand, see the script's header)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_run.sh"

# the stand-in bench: start 1 finishes one cell of each task and then dies; start 2 finishes the
# task's second cell and writes the outputs; "bad" exits 2 (corp's bad-input status) at once
FAKE = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    state = Path(os.environ["FAKE_STATE"])
    n = int(state.read_text()) + 1 if state.exists() else 1
    state.write_text(str(n))
    Path(os.environ["FAKE_STATE"] + ".argv").write_text(" ".join(sys.argv[1:]))
    if os.environ.get("FAKE_MODE") == "bad":
        print("error: bench config: bad", file=sys.stderr); sys.exit(2)
    if os.environ.get("FAKE_MODE") == "memory" and n <= 3:  # corp's memory check: too little memory now
        print("error: m needs about 11.2 GB and 9.6 GB is available", file=sys.stderr); sys.exit(75)
    if os.environ.get("FAKE_MODE") == "crash":  # the same bug on every start, before any cell finishes
        print("AttributeError: planted", file=sys.stderr); sys.exit(1)
    if os.environ.get("FAKE_MODE") == "slow":  # a long bench: one cell every 8 s, 20 cells, each under its claim
        import time
        cells = Path("results/wrap/cells"); cells.mkdir(parents=True, exist_ok=True)
        claims = Path("runs/bench/wrap/claims"); claims.mkdir(parents=True, exist_ok=True)
        Path(os.environ["FAKE_STATE"] + ".pid").write_text(str(os.getpid()))
        for k in range(20):
            with open(claims / f"s{k}.lock", "a+"):  # corp holds a cell's claim open while computing it
                time.sleep(8)  # longer than the wrapper's 5 s look, so stopping early shows
                (cells / f"add__paper__s{k}__base__fixed__0123456789.json").write_text(json.dumps({"status": "done"}))
        sys.exit(0)
    work = Path("runs/bench/wrap")
    seen = sorted(p.name for p in work.glob("*__population__*")) if work.exists() else []
    Path(os.environ["FAKE_STATE"] + f".seen{n}").write_text(" ".join(seen))  # what a start found there
    if os.environ.get("FAKE_MODE") == "scoring":  # a population scored for a while, then the machine stops (kill -9)
        import fcntl, time
        d = Path("runs/bench/wrap/arith__population__s0__run"); d.mkdir(parents=True, exist_ok=True)
        lock = open(d / ".corp.lock", "a+"); fcntl.flock(lock, fcntl.LOCK_EX)  # corp holds its run open
        (d / "run_status.json").write_text(json.dumps({"status": "running"}))
        Path("runs/bench/wrap/arith__shared_evals.jsonl").write_text(json.dumps({"key": "k", "what": "top1"}) + "\\n")
        with open(d / "population.jsonl", "a") as fh:
            for i in range(3):
                fh.write(json.dumps({"kind": "specialist", "index": i}) + "\\n"); fh.flush(); time.sleep(1.5)
            fh.write('{"kind": "spec'); fh.flush()  # a row half written when the copy is taken
            time.sleep(3)
        os._exit(137)  # no status written, no signal to anyone: what a machine that stops leaves
    if os.environ.get("FAKE_MODE") == "pop":
        for name, status in (("arith__population__s0__aaa", "complete"), ("arith__population__s1__bbb", "running"),
                             ("arith__population__s2__held", "complete"), ("letters__population__s0__ccc", "complete"),
                             ("arith__population__s3__int", "interrupted"), ("arith__population__s4__bad", "failed")):
            d = work / name; d.mkdir(parents=True, exist_ok=True)
            (d / "run_status.json").write_text(json.dumps({"status": status}))
            (d / "population.jsonl").write_text(json.dumps({"kind": "specialist", "index": 0, "start": n}) + "\\n")
            (d / ".corp.lock").write_text("123\\n")
            if os.environ.get("FAKE_FAILED_FIRST") and n == 1:  # a first start interrupted: corp's FAILED marker
                (d / "FAILED").write_text("this run was interrupted and is not complete")
            elif os.environ.get("FAKE_FAILED_FIRST"):  # the rerun completes it and corp removes the marker
                (d / "FAILED").unlink(missing_ok=True)
        sys.exit(0)
    cells = Path("results/wrap/cells"); cells.mkdir(parents=True, exist_ok=True)
    Path("runs/bench/wrap").mkdir(parents=True, exist_ok=True)
    Path("runs/bench/wrap/model.bin").write_bytes(b"x" * 1000)
    if n == 1:
        Path("results/wrap/preregistration.json").write_text("{}")  # corp writes it before the first final cell
        (cells / "add__paper__s0__base__fixed__0123456789.json").write_text(json.dumps({"status": "done"}))
        (cells / "letters__paper__s0__base__fixed__0123456789.json").write_text("{}")  # the other task's process
        sys.exit(137)
    (cells / "add__paper__s1__grpo__1.000e+12__abcdef0123.json").write_text(json.dumps({"status": "done"}))
    retention = Path("results/wrap/retention"); retention.mkdir(parents=True, exist_ok=True)
    (retention / "add__paper__s0__base__fixed__0123456789.json").write_text("{}")  # scored off-task once finished
    for name in ("table.md", "results.csv", "bench.json"):
        Path("results/wrap", name).write_text("out")
""")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture()
def repo(tmp_path):
    repo = tmp_path / "checkout"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / ".gitignore").write_text("runs/\n")
    (repo / "wrap.yaml").write_text(
        "name: wrap\ntasks: [{task: arith, label: add}]\nseeds: [0, 1]\nmethods: {self-consistency: null}\n"
    )
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    (repo / "notes.txt").write_text("someone's work in progress\n")  # never the wrapper's to commit
    (repo / "fake.py").write_text(FAKE)
    return repo


def _env(repo: Path, mode: str, methods: str | None = None) -> dict:
    """The wrapper's environment with the stand-in bench in MODE."""
    return {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "CORP_CMD": f"{sys.executable} fake.py",
        "BENCH_POLL": "1",
        "BENCH_RETRY_WAIT": "0",
        "FAKE_STATE": str(repo.parent / "starts"),
        "FAKE_MODE": mode,
        **({"BENCH_METHODS": methods} if methods else {}),
    }


def _wrap(repo: Path, mode: str = "ok", methods: str | None = None, tries: int = 3) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "wrap.yaml", "add", str(tries)],
        cwd=repo,
        env=_env(repo, mode, methods),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_the_wrapper_restarts_the_bench_and_commits_only_its_finished_cells(repo):
    proc = _wrap(repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo.parent / "starts").read_text() == "2", "the stopped bench was not restarted"
    tracked = set(_git(repo, "ls-files").split())
    assert {
        "results/wrap/cells/add__paper__s0__base__fixed__0123456789.json",
        "results/wrap/cells/add__paper__s1__grpo__1.000e+12__abcdef0123.json",
        "results/wrap/table.md",
        "results/wrap/results.csv",
        "results/wrap/bench.json",
        "results/wrap/preregistration.json",  # a later session's run compares its config against it
    } <= tracked
    assert not any(p.startswith("runs/") or "letters" in p or p in ("notes.txt", "fake.py") for p in tracked), tracked
    log = _git(repo, "log", "--format=%s")
    assert "1 finished cell(s): paper__s0__base__fixed" in log and "paper__s1__grpo__1.000e+12" in log, log
    assert "outputs after task add finished" in log
    # a retention record is named as one, not counted as a finished cell (it was "2 finished cell(s)")
    assert "1 finished cell(s): paper__s1__grpo__1.000e+12; retention of 1 finished cell(s)" in log, log
    assert not _git(
        repo, "status", "--porcelain", "--", "results/wrap/cells/add__paper__s0__base__fixed__0123456789.json"
    )


@pytest.mark.slow
def test_the_wrapper_passes_bench_methods_on(repo):
    """BENCH_METHODS splits one task's methods over wrappers (`--methods`); without it no filter."""
    assert _wrap(repo, methods="randopt-r4,corp-r4").returncode == 0
    argv = (repo.parent / "starts.argv").read_text()
    assert argv.endswith("--task add --methods randopt-r4,corp-r4"), argv
    (repo.parent / "starts").unlink()
    assert _wrap(repo).returncode == 0
    assert "--methods" not in (repo.parent / "starts.argv").read_text()


def test_the_wrapper_waits_out_too_little_memory_and_does_not_count_it_as_barren(repo):
    """Planted (the size claim's S run, 2026-12-07: one wrapper's bench was refused by the memory check
    while other work held memory, exited 2 and its wrapper gave up): status 75 is retried after
    BENCH_MEMORY_WAIT, three times in a row without stopping as barren, and the fourth start finishes."""
    env = {**_env(repo, "memory"), "BENCH_MEMORY_WAIT": "0"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "wrap.yaml", "add", "6"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert (repo.parent / "starts").read_text() == "4" and "too little memory" in proc.stderr


def test_the_wrapper_does_not_retry_bad_input(repo):
    proc = _wrap(repo, "bad")
    assert proc.returncode == 2 and (repo.parent / "starts").read_text() == "1"
    assert "not retrying" in proc.stderr


@pytest.mark.slow
def test_the_wrapper_stops_after_three_starts_in_a_row_that_finish_nothing(repo):
    """A bench that fails the same way on every start (bench-noise-3's first corp-r4 cell: 19 starts of
    two wrappers, each loading an engine and stopping in the same step search) is stopped after 3 such
    starts, not TRIES (20 by default), in one line saying what to do; a start that committed a cell
    resets the count (the restart test above: start 1 finishes a cell and dies, start 2 finishes)."""
    proc = _wrap(repo, "crash", tries=20)
    assert proc.returncode == 1 and (repo.parent / "starts").read_text() == "3", proc.stderr
    assert "3 starts in a row stopped with status 1 and finished nothing" in proc.stderr
    assert "fix it, and start the wrapper again" in proc.stderr


@pytest.mark.slow
def test_sigusr1_lets_the_running_cell_finish_then_stops_the_bench(repo):
    """Ending a session: SIGUSR1 waits for the cell its bench is running (the claim it holds), commits it
    and stops the bench (exit 0, no restart). Planted: the signal arrives after the first cell, while the
    second runs, and another process's cell of the same task finishes meanwhile: a wrapper without the
    handler dies on SIGUSR1 at once (the bench runs on, the second cell is never committed); one that
    stopped at any new record of the task would kill the second cell on the other process's record."""
    import signal
    import time

    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "wrap.yaml", "add", "3"],
        cwd=repo,
        env=_env(repo, "slow"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while "s0__base" not in _git(repo, "log", "--format=%s") and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGUSR1)
        seen = []
        for line in proc.stdout:  # once the wrapper has taken the signal, the other wrapper's bench finishes a cell
            seen.append(line)
            if "SIGUSR1" in line:
                break
        other = repo / "results" / "wrap" / "cells" / "add__paper__s99__grpo__1.000e+12__abcdef0123.json"
        other.write_text(json.dumps({"status": "done"}))
        out, _ = proc.communicate(timeout=60)
        out = "".join(seen) + out
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    log = _git(repo, "log", "--format=%s")
    assert "s1__base" in log, "the cell running when the signal came was not committed"
    committed = [f for f in _git(repo, "ls-files").split() if "/cells/" in f]
    assert 3 <= len(committed) <= 4 and "stopped on SIGUSR1" in out, (committed, out)
    assert (repo.parent / "starts").read_text() == "1", "the bench was restarted after the signal"
    bench = int((repo.parent / "starts.pid").read_text())
    with pytest.raises(ProcessLookupError):  # the bench was stopped, not left running
        os.kill(bench, 0)


def test_the_wrapper_refuses_a_task_the_config_does_not_have(repo):
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "CORP_CMD": "false"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "wrap.yaml", "nope"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "task 'nope' is not a task of wrap" in proc.stderr


@pytest.mark.slow
def test_the_wrapper_keeps_finished_populations_and_restores_them_in_a_later_session(repo):
    """A finished or interrupted population run of its task that no process holds is committed
    under RESULTS/populations (lock file left out); a running or failed one, one a corp process
    holds and another task's are not. A later start in a checkout without runs/ finds the committed ones restored
    before the bench starts, and a run directory already there is never overwritten."""
    work = repo / "runs" / "bench" / "wrap"
    held = work / "arith__population__s2__held"
    held.mkdir(parents=True)
    with (held / ".corp.lock").open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a corp process has this run open
        proc = _wrap(repo, "pop")
    assert proc.returncode == 0, proc.stderr
    tracked = set(_git(repo, "ls-files").split())
    pops = {p for p in tracked if "/populations/" in p}
    assert pops == {
        "results/wrap/populations/arith__population__s0__aaa/run_status.json",
        "results/wrap/populations/arith__population__s0__aaa/population.jsonl",
        "results/wrap/populations/arith__population__s3__int/run_status.json",
        "results/wrap/populations/arith__population__s3__int/population.jsonl",
    }, pops
    assert "population run(s), kept" in _git(repo, "log", "--format=%s")

    shutil.rmtree(repo / "runs")  # a later session: a fresh checkout has no run directories
    (repo.parent / "starts").unlink()
    assert _wrap(repo, "ok").returncode == 0
    seen = (repo.parent / "starts.seen1").read_text()
    assert seen == "arith__population__s0__aaa arith__population__s3__int", f"not restored before the start: {seen}"
    row = json.loads((work / "arith__population__s0__aaa" / "population.jsonl").read_text())
    assert row["start"] == 1  # the committed copy

    mine = work / "arith__population__s0__aaa"
    (mine / "population.jsonl").write_text("mine\n")
    before = sorted(p.relative_to(mine) for p in mine.rglob("*"))
    (repo.parent / "starts").unlink()
    assert _wrap(repo, "ok").returncode == 0
    assert (mine / "population.jsonl").read_text() == "mine\n"
    assert sorted(p.relative_to(mine) for p in mine.rglob("*")) == before, "something was copied into it"


@pytest.mark.slow
def test_a_population_being_scored_and_the_shared_evaluations_are_committed_so_far_and_restored(repo):
    """Planted (the size claim, 2026-12-07: the machine stopped without warning and the S population of seed 3,
    scored for most of an hour, was lost: the wrapper committed populations only once no process held them).
    With BENCH_SNAPSHOT=2 the rows so far are committed while the run is held; the bench then dies as a
    stopped machine leaves it (status running), and the committed copy parses to the rows written, the torn
    last one dropped as corp's reader drops it."""
    from corp.runtime.runs import read_jsonl

    env = {**_env(repo, "scoring"), "BENCH_SNAPSHOT": "2", "BENCH_POLL": "1000"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "wrap.yaml", "add", "1"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )
    assert "so far, while scoring" in _git(repo, "log", "--format=%s"), proc.stdout + proc.stderr
    committed = repo / "results/wrap/populations/arith__population__s0__run"
    assert "results/wrap/populations/arith__population__s0__run/population.jsonl" in _git(repo, "ls-files")
    assert not (committed / ".corp.lock").exists()
    rows = read_jsonl(committed / "population.jsonl", key="index", repair=False)
    assert [r["index"] for r in rows] == [0, 1, 2], rows
    assert json.loads((committed / "run_status.json").read_text())["status"] == "running"
    # the task's shared evaluations (a cell's top-1 and vote test passes) go with it, and come back in a fresh checkout
    assert "results/wrap/populations/arith__shared_evals.jsonl" in _git(repo, "ls-files")
    shutil.rmtree(repo / "runs")
    (repo.parent / "starts").unlink()
    assert _wrap(repo, "ok").returncode == 0
    restored = repo / "runs/bench/wrap/arith__shared_evals.jsonl"
    assert json.loads(restored.read_text())["what"] == "top1"
    restored.write_text("mine\n")  # one that is there is never overwritten
    (repo.parent / "starts").unlink()
    assert _wrap(repo, "ok").returncode == 0 and restored.read_text() == "mine\n"


@pytest.mark.slow
def test_a_population_completed_by_a_rerun_loses_its_failed_marker_in_the_committed_copy(repo):
    """Planted (the size claim's L seed-0 population, 2026-12-07: committed while its first start had failed, then
    completed by a rerun, and kept the FAILED file beside its "complete" status): the copy follows corp, which
    removes FAILED when a rerun completes the run."""
    env = {**_env(repo, "pop"), "FAKE_FAILED_FIRST": "1"}
    run = lambda: subprocess.run(  # noqa: E731
        ["bash", str(SCRIPT), "wrap.yaml", "add", "1"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )
    assert run().returncode == 0
    failed = "results/wrap/populations/arith__population__s0__aaa/FAILED"
    assert failed in _git(repo, "ls-files")
    assert run().returncode == 0
    assert failed not in _git(repo, "ls-files").split(), "the stale FAILED copy is still committed"
    assert not (repo / failed).exists()
