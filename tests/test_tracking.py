"""`--report-to tensorboard`: a run's logged steps, rounds and specialists are in TensorBoard event
files, there while the run goes on (live, as TRL), read back here with tensorboard's own
EventAccumulator; a backend that is not installed is one line; a command with nothing to log does
not take the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corp.cli import app
from corp.config import load_config
from corp.methods import REGISTRY

pytest.importorskip(
    "tensorboard", reason="--report-to tensorboard needs the tensorboard extra (pip install 'corp[tensorboard]')"
)
COMMON = {"task": "arith", "reward": "tests.test_methods:text_checksum", "seed": 1}


def events(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def run(name: str, tiny_dir: Path, run_dir: Path, **extra) -> dict:
    m = REGISTRY[name]
    return m(
        load_config(m.config, None, {**m.smoke, **COMMON, "model": str(tiny_dir), "run_dir": str(run_dir), **extra})
    )


@pytest.mark.parametrize(
    "name,log,step_key",
    [("es", "metrics.jsonl", "iteration"), ("grpo", "metrics.jsonl", "step"), ("fera", "rounds.jsonl", "round")],
)
def test_logged_steps_are_in_the_event_files(name, log, step_key, tiny_dir, tmp_path):
    run_dir = tmp_path / name
    run(name, tiny_dir, run_dir, report_to="tensorboard")
    rows = [json.loads(line) for line in (run_dir / log).read_text().splitlines() if line.strip()]
    assert len(rows) >= 2, rows
    got = events(run_dir / "tensorboard")
    numeric = [
        k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != step_key
    ]
    assert numeric, rows[0]
    for k in numeric:
        want = [(r[step_key], float(r[k])) for r in rows if isinstance(r.get(k), (int, float))]
        assert [(s, pytest.approx(v, rel=1e-6, abs=1e-9)) for s, v in want] == got[k], k
    # a rerun on the same run directory (nothing recomputed) rebuilds the events whole, never doubled
    run(name, tiny_dir, run_dir, report_to="tensorboard")
    assert events(run_dir / "tensorboard") == got


def test_without_report_to_no_event_files(tiny_dir, tmp_path):
    run("es", tiny_dir, tmp_path / "es")
    assert (tmp_path / "es" / "metrics.jsonl").exists() and not (tmp_path / "es" / "tensorboard").exists()


def test_bench_results_are_logged_at_their_budgets(tmp_path):
    from corp.tracking import export_bench_results

    (tmp_path / "results.csv").write_text(
        "task,method,setting,budget,seed,accuracy,flops,status\n"
        "arith,base,paper,,0,0.122,0,done\n"
        "arith,corp-stage1,paper,4e+12,0,0.2,7.9e12,done\n"
        "arith,corp-stage1,paper,1.2e+13,0,0.25,1.3e13,done\n"
        "arith,grpo,paper,1.2e+13,0,,,not-run\n"
    )
    assert export_bench_results(tmp_path, "tensorboard") == 3
    got = events(tmp_path / "tensorboard")
    assert got["arith/paper/corp-stage1/seed0/accuracy"] == [
        (4_000_000_000_000, pytest.approx(0.2)),
        (12_000_000_000_000, pytest.approx(0.25)),
    ]
    assert got["arith/paper/base/seed0/accuracy"] == [(0, pytest.approx(0.122))]
    assert not any("grpo" in t for t in got)


@pytest.mark.parametrize(
    "value,expect",
    [
        ("wandb", "--report-to wandb needs wandb; install it with `pip install 'corp[wandb]'`"),
        ("tensorbored", "--report-to 'tensorbored': unknown backend tensorbored"),
    ],
)
def test_a_backend_that_is_not_there_is_one_line(value, expect, tmp_path, monkeypatch):
    import importlib.util

    if value == "wandb" and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    monkeypatch.chdir(tmp_path)
    for args in (
        ["es", "--model", "no-such/model", "--report-to", value],
        ["bench", "--config", "nope.yaml", "--report-to", value],
    ):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        lines = [line for line in res.output.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and expect in lines[0], res.output
    assert not (tmp_path / "runs").exists()


def test_a_run_that_logs_nothing_says_report_to_wrote_nothing(tiny_dir, tmp_path):
    """randopt on a population scored elsewhere (--from-run) writes no row of its own: --report-to
    tensorboard used to end with nothing written and nothing said (issue 41)."""
    run("score", tiny_dir, tmp_path / "pop")
    with pytest.warns(UserWarning, match="--report-to tensorboard: corp randopt logged no metrics in this run"):
        run("randopt", tiny_dir, tmp_path / "run", report_to="tensorboard", from_run=str(tmp_path / "pop"))
    assert not (tmp_path / "run" / "tensorboard").exists()


@pytest.mark.parametrize(
    "name,log,step_key,tag",
    [
        ("es", "metrics.jsonl", "iteration", "reward_mean"),  # per iteration
        ("grpo", "metrics.jsonl", "step", "reward"),  # per step
        ("fera", "rounds.jsonl", "round", "bytes_up"),  # per round
        ("randopt", "population.jsonl", "index", "population/reward"),  # per specialist
    ],
)
def test_events_are_written_while_the_run_goes_on(name, log, step_key, tag, tiny_dir, tmp_path, monkeypatch):
    """Issue 40: the event file holds the first row's metrics before the run's next row is written
    (read back inside the run, right after each row went to the backends); it used to appear only
    when the run ended."""
    from corp.tracking import LiveLog

    run_dir, seen = tmp_path / name, []
    log_row = LiveLog.log

    def log_and_read(self, path, row):
        log_row(self, path, row)
        if Path(path).name == log:
            seen.append((row.get(step_key), events(run_dir / "tensorboard").get(tag, [])))

    monkeypatch.setattr(LiveLog, "log", log_and_read)
    run(name, tiny_dir, run_dir, report_to="tensorboard")
    rows = [json.loads(line) for line in (run_dir / log).read_text().splitlines() if line.strip()]
    assert len(seen) == len(rows) >= 2, (seen, rows)
    key = tag.removeprefix("population/")
    for i, (step, logged) in enumerate(seen):  # after row i: rows 0..i are there, and no later one
        want = [(r[step_key], pytest.approx(float(r[key]), rel=1e-6, abs=1e-9)) for r in rows[: i + 1]]
        assert sorted(logged) == sorted(want, key=lambda sv: sv[0]), (i, step, logged)
    assert sorted(events(run_dir / "tensorboard")[tag]) == sorted(seen[-1][1])


def test_commands_with_nothing_to_log_do_not_take_report_to():
    """eval, self-consistency and fedcorp write no metrics rows of their own: the option is not theirs."""
    from corp.config import option_names

    for name in ("eval", "self-consistency", "fedcorp"):
        assert "report_to" not in option_names(REGISTRY[name].config)
        res = CliRunner().invoke(app, [name, "--report-to", "tensorboard"])
        assert res.exit_code == 2 and "--report-to" in res.output, res.output
    for name in ("score", "randopt", "consolidate", "analyze-rank", "es", "grpo", "ftis", "fgrpo", "fera"):
        assert "report_to" in option_names(REGISTRY[name].config), name
