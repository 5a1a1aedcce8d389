"""Names derived from user input are bounded; a full disk, a negative --threads, a directory as
--eval-cache and an output under a file are one line each; a failed run records it where it can."""

from __future__ import annotations

import errno

import pytest
import typer

from corp import CorpError
from corp.config import RandOptConfig, load_config
from corp.runs import FAILED_FILE, finish_run_dir, open_run_dir, run_name


def test_a_long_task_name_gives_a_bounded_unique_run_directory(tmp_path):
    deep = "jsonl:" + "/".join(["a-rather-long-directory-name"] * 12) + "/data.jsonl"
    other = deep.replace("data.jsonl", "other.jsonl")
    a, b = run_name(deep, "randopt", 0), run_name(other, "randopt", 0)
    assert len(a.encode()) < 120 and a != b
    path, created = open_run_dir(None, deep, "randopt", 0, root=tmp_path)  # ENAMETOOLONG before
    assert created and path.is_dir()


def test_bench_record_names_are_bounded():
    from corp.bench.sweep import _slug

    a, b = _slug("jsonl:" + "x" * 300 + "/a.jsonl"), _slug("jsonl:" + "x" * 300 + "/b.jsonl")
    assert len(a) <= 64 and len(b) <= 64 and a != b
    assert _slug("arith:digits=3") == "arith-digits-3"  # short names are unchanged (existing records keep their names)


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

    monkeypatch.setattr("corp.runs.atomic_write_text", full)
    monkeypatch.setattr("corp.runs.write_json", full)
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
