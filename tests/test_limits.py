"""Names derived from user input are bounded; a full disk, a negative --threads, a directory as
--eval-cache and an output under a file are one line each; a failed run records it where it can."""

from __future__ import annotations

import errno
import json

import pytest
import typer

from corp.config import RandOptConfig, load_config
from corp.errors import CorpError
from corp.runtime.runs import FAILED_FILE, finish_run_dir, open_run_dir, run_name


def test_a_long_task_name_gives_a_bounded_unique_run_directory(tmp_path):
    deep = "jsonl:" + "/".join(["a-rather-long-directory-name"] * 12) + "/data.jsonl"
    other = deep.replace("data.jsonl", "other.jsonl")
    a, b = run_name(deep, "randopt", 0), run_name(other, "randopt", 0)
    assert len(a.encode()) < 120 and a != b
    path, created = open_run_dir(None, deep, "randopt", 0, root=tmp_path)  # ENAMETOOLONG before
    assert created and path.is_dir()


def test_bench_record_names_are_bounded():
    from corp.bench.config import file_slug

    a, b = file_slug("jsonl:" + "x" * 300 + "/a.jsonl"), file_slug("jsonl:" + "x" * 300 + "/b.jsonl")
    assert len(a) <= 64 and len(b) <= 64 and a != b
    assert (
        file_slug("arith:digits=3") == "arith-digits-3"
    )  # short names are unchanged (existing records keep their names)


def test_threads_and_eval_cache_are_checked(tmp_path):
    with pytest.raises(CorpError, match="--threads must be >= 1"):
        load_config(RandOptConfig, None, {"threads": -1})
    assert load_config(RandOptConfig, None, {"threads": 0}).threads == 0  # 0: torch's default, as unset
    with pytest.raises(CorpError, match="--eval-cache .* is a directory"):
        load_config(RandOptConfig, None, {"eval_cache": str(tmp_path)})


def test_a_failed_run_on_a_full_disk_says_so_and_keeps_its_own_error(tmp_path, monkeypatch):
    (tmp_path / "population.jsonl").write_text("{}\n")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("corp.runtime.runs.atomic_write_text", full)
    monkeypatch.setattr("corp.runtime.runs.write_json", full)
    with pytest.warns(UserWarning, match=r"could not record .*\(No space left"):
        assert finish_run_dir(tmp_path, False, RuntimeError("boom")) == "failed"
    monkeypatch.undo()
    assert finish_run_dir(tmp_path, False, RuntimeError("boom")) == "failed" and (tmp_path / FAILED_FILE).is_file()


def test_a_full_disk_is_one_line_at_the_cli(capsys):
    from corp.cli import _run

    def write():
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/population.jsonl")

    with pytest.raises(typer.Exit) as exit_:
        _run(write)
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        exit_.value.exit_code == 2
        and len(err) == 1
        and "No space left on device ('/runs/x/population.jsonl')" in err[0]
    )


def _es_cli(model_dir, run_dir, *extra):
    from typer.testing import CliRunner

    from corp.cli import app

    args = ["es", "--model", str(model_dir), "--task", "arith", "--iterations", "1", "--population-per-iteration", "2"]
    args += ["--sigma", "0.05", "--n-support", "2", "--n-probe", "0", "--n-validation", "0", "--n-test", "2"]
    args += ["--max-completion-length", "2", "--output-dir", str(run_dir), *extra]
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("where", ["tokenizer", "card", "events"])
def test_a_full_disk_in_any_library_is_one_line_naming_the_path_and_the_run_is_failed(
    where, tiny_dir, tmp_path, monkeypatch
):
    """The tokenizers library raises a bare `Exception: ... (os error 28)` saving the tokenizer; a card
    or an event file fails with an OSError that names no file. Each is one line naming the path, the
    run is marked failed (not complete), and what was computed stays (issue 41: a traceback, or a
    warning and a run marked complete)."""
    from pathlib import Path

    from transformers import PreTrainedTokenizerFast

    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    if where == "tokenizer":

        def full(*a, **k):
            raise Exception("No space left on device (os error 28)")

        monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", full)
        named = run / "model"
    elif where == "card":
        write_text = Path.write_text

        def full(self, *a, **k):
            if self.name.startswith(".README.md"):
                raise OSError(errno.ENOSPC, "No space left on device")  # from write(): no file named
            return write_text(self, *a, **k)

        monkeypatch.setattr(Path, "write_text", full)
        named = run / "model" / "README.md"
    else:

        def full(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr("corp.tracking.Trackers.log", full)
        named = run / "tensorboard"
    res = _es_cli(tiny_dir, run, "--report-to", "tensorboard")
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert str(named) in lines[0] and "No space left on device" in lines[0], lines[0]
    status = json.loads((run / "run_status.json").read_text())
    assert status["status"] == "failed" and (run / FAILED_FILE).is_file(), status
    assert (run / "metrics.jsonl").read_text().strip() and (run / "population.jsonl").is_file()


def test_a_report_written_on_a_full_disk_names_its_file(tmp_path, monkeypatch):
    """write() and fsync() on an open file raise an OSError naming no file: the atomic writer names it."""
    from corp.runtime.runs import append_jsonl, write_json

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("corp.runtime.runs.os.fsync", full)
    for write, path in ((write_json, tmp_path / "report.json"), (append_jsonl, tmp_path / "evals.jsonl")):
        with pytest.raises(OSError) as exc:
            write(path, {"a": 1})
        assert exc.value.filename == str(path)


def _one_line(res, *fragments: str) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_silently_wrong_options_are_one_line(tmp_path):
    """Each of these used to run and write nothing, or one thing twice (issue 41)."""
    from typer.testing import CliRunner

    from corp.cli import app

    def cli(*args):
        return CliRunner().invoke(app, list(args))

    pytest.importorskip("tensorboard")
    _one_line(cli("es", "--model", "no-such/model", "--report-to", "tensorboard,tensorboard"), "tensorboard twice")
    # eval logs nothing: the option is not eval's (before the model loads: no "model not found")
    _one_line(cli("eval", "--model", "no-such/model", "--report-to", "tensorboard"), "--report-to")
    (tmp_path / "c.yaml").write_text("max-new-tokens: 4\nmax_new_tokens: 8\n")
    _one_line(
        cli("randopt", "--model", "no-such/model", "--config", str(tmp_path / "c.yaml")),
        "'max-new-tokens'",
        "'max_new_tokens'",
    )
    (tmp_path / "b.yaml").write_text("name: b\nseeds: [0, 0]\nbudgets: [1e9]\nmethods: {randopt: {}}\n")
    _one_line(cli("bench", "--config", str(tmp_path / "b.yaml")), "seeds [0, 0]", "repeat 0")


@pytest.mark.parametrize("command", ["apply", "self-consistency"])
def test_ctrl_c_says_what_fits_the_command(command, tmp_path, monkeypatch):
    """Ctrl-C printed the population message ("every specialist already scored...") for every command."""
    from typer.testing import CliRunner

    from corp.cli import app

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    if command == "apply":
        monkeypatch.setattr("corp.cli.apply_recipe", interrupted)
        args = ["apply", str(tmp_path / "recipe.json"), "--out", str(tmp_path / "out")]
    else:
        monkeypatch.setattr("corp.methods.Method.__call__", interrupted)
        args = ["self-consistency", "--output-dir", str(tmp_path / "run")]
    res = CliRunner().invoke(app, args)
    said = [ln for ln in res.output.splitlines() if ln.startswith("interrupted")]
    assert res.exit_code == 130 and len(said) == 1 and "specialist" not in said[0], res.output
    assert ("--out" in said[0]) if command == "apply" else ("--output-dir" in said[0] and str(tmp_path) in said[0])


def test_ctrl_c_names_where_the_work_is_saved_and_never_claims_what_was_not(tiny_dir, tmp_path, monkeypatch):
    """Issue 57: `corp analyze-rank` (no --output-dir) interrupted said "every evaluation already finished is
    saved; rerun with the same --output-dir to resume" naming no directory, and nothing of the analysis
    was saved. Now the line names the run directory its rows are in, or says nothing was saved."""
    from typer.testing import CliRunner

    from corp.cli import app

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("corp.methods.analyze_rank.split_half.analyze_population", interrupted)
    small = ["--model", str(tiny_dir), "--task", "arith", "--n-support", "2", "--n-probe", "0", "--n-validation", "0"]
    small += ["--n-test", "2", "--max-completion-length", "2", "--population", "4", "--sigmas", "0.05"]
    small += ["--splits", "1", "--permutations", "19", "--skip-power", "--ranks", "1"]
    res = CliRunner().invoke(app, ["analyze-rank", *small])  # scores the population into runs/NAME, then Ctrl-C
    said = [ln for ln in res.output.splitlines() if ln.startswith("interrupted")]
    (run,) = (tmp_path / "runs").iterdir()
    assert res.exit_code == 130 and len(said) == 1, res.output
    assert (
        f"saved in '{run.relative_to(tmp_path)}'" in said[0] and f"--output-dir {run.relative_to(tmp_path)}" in said[0]
    )
    assert (run / "population.jsonl").is_file()
    # the analysis of an existing run, interrupted: nothing of it was saved, and the line says so
    res = CliRunner().invoke(app, ["analyze-rank", "--from-run", str(run), "--splits", "1", "--ranks", "1"])
    said = [ln for ln in res.output.splitlines() if ln.startswith("interrupted")]
    assert res.exit_code == 130 and len(said) == 1 and "saved nothing" in said[0] and "is saved" not in said[0], said


def test_a_full_disk_in_apply_names_out_not_output_dir(monkeypatch):
    """Issue 57: a full disk in `corp apply` said "the same --output-dir resumes"; apply takes --out."""
    from typer.testing import CliRunner

    from corp.cli import app

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "/x/out/README.md")

    monkeypatch.setattr("corp.cli.apply_recipe", full)
    res = CliRunner().invoke(app, ["apply", "recipe.json", "--out", "/x/out"])
    assert res.exit_code == 2 and "--out" in res.output and "--output-dir" not in res.output, res.output


def test_a_long_task_label_gives_bounded_plot_names():
    from corp.bench.config import file_part

    a, b = file_part("x" * 300 + "-a"), file_part("x" * 300 + "-b")
    assert len(a) <= 64 and len(b) <= 64 and a != b
    assert file_part("arith:digits=3") == "arith-digits-3"  # short labels keep their plots' names


def test_a_reward_is_its_resolved_file_and_function(tmp_path, monkeypatch):
    """`rw.py:f` and `/abs/rw.py:f` (and `rw:f` from the same directory) are one reward on resume."""
    from corp.evaluate.rewards import reward_identity

    (tmp_path / "rw.py").write_text("def f(completions, **kw):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    same = {reward_identity(s) for s in ("rw.py:f", "./rw.py:f", f"{tmp_path}/rw.py:f", "rw:f")}
    assert same == {f"{(tmp_path / 'rw.py').resolve()}:f"}, same
    assert reward_identity("rw.py:g") != reward_identity("rw.py:f") and reward_identity(None) == "correct"


def test_a_run_resumes_with_the_same_reward_named_another_way(tiny_dir, tmp_path, monkeypatch):
    """A population scored with `--reward rw.py:f` resumes under `--reward /abs/rw.py:f` (the same
    file and function) without being refused or rescored (issue 41: "was made with reward = rw.py:f")."""
    from typer.testing import CliRunner

    from corp.cli import app

    (tmp_path / "rw.py").write_text("def f(completions, **kw):\n    return [len(c) / 10 for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    args = ["score", "--model", str(tiny_dir), "--task", "arith", "--population", "2", "--sigmas", "0.05"]
    args += [
        "--n-support",
        "2",
        "--n-probe",
        "0",
        "--n-validation",
        "0",
        "--n-test",
        "0",
        "--max-completion-length",
        "2",
    ]
    args += ["--output-dir", str(tmp_path / "run")]
    first = CliRunner().invoke(app, [*args, "--reward", "rw.py:f"])
    assert first.exit_code == 0, first.output
    rows = (tmp_path / "run" / "population.jsonl").read_text()
    again = CliRunner().invoke(app, [*args, "--reward", f"{tmp_path}/rw.py:f"])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "run" / "population.jsonl").read_text() == rows, "nothing rescored"


def _to_dev_full(monkeypatch, name: str):
    """The temporary files corp.runtime.runs writes for targets named `name` are /dev/full: every write
    fails ENOSPC."""
    import os
    import tempfile

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    real = tempfile.mkstemp

    def fake(*a, dir=None, prefix=None, suffix=None, **k):
        if prefix == f".{name}.":
            return os.open("/dev/full", os.O_WRONLY), os.path.join(dir, f"{prefix}full{suffix}")
        return real(*a, dir=dir, prefix=prefix, suffix=suffix, **k)

    monkeypatch.setattr("corp.runtime.runs.tempfile.mkstemp", fake)


class _FillsUp:
    """A binary file on a disk that fills up after `room` bytes: its write raises ENOSPC, as a
    buffered file's does when its buffer cannot be flushed."""

    def __init__(self, room: int):
        self.room = room

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        raise AssertionError("not reached: the write fails first")


def test_torch_save_on_a_full_disk_raises_the_disk_error_not_torchs(tmp_path, monkeypatch):
    """torch.save wraps a write's ENOSPC in RuntimeError "unexpected pos" (the errno lost: a traceback
    at the CLI, and corp bench stopped on it); through corp's writer it is the OSError, which names
    the file, and the old file is kept."""
    import torch

    from corp.runtime.runs import atomic_write_with, save_through

    state = {"x": torch.zeros(100_000)}
    with pytest.raises(RuntimeError, match="unexpected pos"):
        torch.save(state, _FillsUp(1000))  # what torch alone does: the planted case
    with pytest.raises(OSError) as exc:
        save_through(_FillsUp(1000), lambda f: torch.save(state, f))
    assert exc.value.errno == errno.ENOSPC
    path = tmp_path / "state.pt"
    atomic_write_with(path, lambda f: torch.save({"x": torch.ones(3)}, f))
    _to_dev_full(monkeypatch, "state.pt")
    with pytest.raises(OSError) as exc:
        atomic_write_with(path, lambda f: torch.save(state, f))
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(path)
    assert torch.load(path)["x"].tolist() == [1.0, 1.0, 1.0] and not list(tmp_path.glob(".state.pt.*"))


def test_a_grpo_checkpoint_on_a_full_disk_is_one_line_and_the_run_is_failed(tiny_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from corp.cli import app

    _to_dev_full(monkeypatch, "checkpoint.pt")
    run = tmp_path / "run"
    args = ["grpo", "--model", str(tiny_dir), "--task", "arith", "--max-steps", "1", "--prompts-per-step", "1"]
    args += ["--num-generations", "2", "--n-support", "2", "--n-probe", "0", "--n-validation", "0", "--n-test", "2"]
    args += ["--max-completion-length", "2", "--lora-r", "0", "--output-dir", str(run)]
    res = CliRunner().invoke(app, args)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert "No space left on device" in lines[0] and str(run / "checkpoint.pt") in lines[0], lines[0]
    assert json.loads((run / "run_status.json").read_text())["status"] == "failed"


def test_opening_a_run_directory_leaves_another_processs_write_probe_alone(tmp_path):
    """Two bench processes open one shared population run at once; with one shared probe name the first to
    finish removed the other's probe under it, and the other stopped with 'not writable (No such file or
    directory)' (seen in `make test`: test_two_processes_share_one_task_...). Planted: the other process's
    probe, present mid-check, must still be there afterwards."""
    from corp.runtime.runs import open_run_dir

    run = tmp_path / "run"
    run.mkdir()
    theirs = run / ".write-test"
    theirs.write_text("theirs")
    assert open_run_dir(run, "arith", "score", 0) == (run, False)
    assert theirs.read_text() == "theirs" and sorted(p.name for p in run.iterdir()) == [".write-test"]


def test_another_split_seed_on_an_existing_run_names_the_option_and_the_runs_value(tiny_dir, tmp_path, monkeypatch):
    """Issue 57: resuming under another --split-seed said "example_ids = 4 different ids, not 4 ids",
    naming no option; now it names --split-seed and the run's own value to resume with."""
    from typer.testing import CliRunner

    from corp.cli import app

    monkeypatch.chdir(tmp_path)
    args = ["score", "--model", str(tiny_dir), "--task", "arith", "--population", "2", "--sigmas", "0.05"]
    args += ["--n-support", "4", "--n-probe", "0", "--n-validation", "0", "--n-test", "2"]
    args += ["--max-completion-length", "2", "--output-dir", str(tmp_path / "run")]
    assert CliRunner().invoke(app, args).exit_code == 0
    res = CliRunner().invoke(app, [*args, "--split-seed", "5"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error")]
    assert len(err) == 1 and "--split-seed (split_seed in Python)" in err[0], res.stderr
    assert "resume it with --split-seed 0 --n-support 4 --n-test 2" in err[0] and "another --output-dir" in err[0]
