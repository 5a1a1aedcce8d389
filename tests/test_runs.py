import pytest

from corp.errors import CorpError
from corp.runtime.runs import append_jsonl, read_jsonl


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    p = tmp_path / "population.jsonl"
    append_jsonl(p, {"key": "a", "v": 1})
    append_jsonl(p, {"key": "b", "v": 2})
    with open(p, "a") as fh:
        fh.write('{"key": "c", "v"')  # killed mid-write
    rows = read_jsonl(p, key="key")
    assert [r["key"] for r in rows] == ["a", "b"]
    append_jsonl(p, {"key": "c", "v": 3})
    assert [r["key"] for r in read_jsonl(p, key="key")] == ["a", "b", "c"]


def test_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / "population.jsonl"
    p.write_text('{"key": "a"}\ngarbage\n{"key": "b"}\n')
    with pytest.raises(CorpError, match="line 2"):
        read_jsonl(p, key="key")


def test_append_after_a_complete_row_missing_its_newline_starts_a_fresh_line(tmp_path):
    p = tmp_path / "population.jsonl"
    append_jsonl(p, {"key": "a", "v": 1})
    with open(p, "a") as fh:
        fh.write('{"key": "b", "v": 2}')  # complete, but its newline was lost
    append_jsonl(p, {"key": "c", "v": 3})  # without reading first
    assert [r["key"] for r in read_jsonl(p, key="key")] == ["a", "b", "c"], "b is neither glued to c nor dropped"


def test_append_after_a_torn_fragment_cuts_it(tmp_path):
    p = tmp_path / "population.jsonl"
    append_jsonl(p, {"key": "a", "v": 1})
    with open(p, "a") as fh:
        fh.write('{"key": "b", "v"')  # killed mid-write, and nobody read the file since
    append_jsonl(p, {"key": "c", "v": 3})
    assert [r["key"] for r in read_jsonl(p, key="key")] == ["a", "c"]


def test_readers_collapse_duplicate_keys(tmp_path):
    p = tmp_path / "population.jsonl"
    for row in ({"key": "a", "v": 1}, {"key": "b", "v": 2}, {"key": "a", "v": 1}):
        append_jsonl(p, row)
    assert [r["key"] for r in read_jsonl(p, key="key", unique=True)] == ["a", "b"]


def test_second_process_on_a_locked_run_dir_gets_one_error_naming_the_holder(tmp_path):
    import subprocess
    import sys
    import time

    from corp.runtime.runs import RunLock

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from corp.runtime.runs import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CorpError, match=f"in use by another corp process \\(pid {holder.pid}\\)"):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    lock = RunLock(tmp_path).acquire()  # the kernel released the dead holder's lock
    lock.release()


def test_failed_run_is_removed_only_if_created_now_and_empty_of_results(tmp_path):
    from corp.runtime.runs import FAILED_FILE, STATUS_FILE, finish_run_dir, read_json, write_json

    made = tmp_path / "made"
    made.mkdir()
    write_json(made / "splits.json", {})
    assert finish_run_dir(made, True, RuntimeError("model not found")) == "removed" and not made.exists()

    computed = tmp_path / "computed"
    computed.mkdir()
    append_jsonl(computed / "population.jsonl", {"key": "a"})
    assert finish_run_dir(computed, True, RuntimeError("boom")) == "failed"
    assert "boom" in (computed / FAILED_FILE).read_text() and read_json(computed / STATUS_FILE)["status"] == "failed"

    users = tmp_path / "users"  # existed before this invocation: never removed, even if it holds only setup files
    users.mkdir()
    write_json(users / "splits.json", {})
    assert finish_run_dir(users, False, RuntimeError("x")) == "failed" and (users / "splits.json").exists()
    assert finish_run_dir(users, False, None) == "complete" and not (users / FAILED_FILE).exists()


def _append_many(path, who: str, n: int, go) -> None:
    from corp.runtime.runs import append_jsonl

    go.wait()  # every appender starts at once
    for i in range(n):
        append_jsonl(path, {"key": f"{who}-{i}", "pad": "x" * 200_000})


def test_appenders_in_several_processes_lose_no_row(tmp_path):
    """Two bench processes split by `--methods` append to one task's evaluation cache. Rows large
    enough to take several writes (200 kB) let an appender see another's row in flight as a torn
    tail and cut it: every row must survive, each exactly once (without the lock in append_jsonl,
    most runs of this test lose rows)."""
    import multiprocessing as mp

    from corp.runtime.runs import read_jsonl

    path = tmp_path / "shared.jsonl"
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=_append_many, args=(path, who, 150, go)) for who in "abcd"]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    rows = read_jsonl(path, key="key", repair=False)
    assert sorted(r["key"] for r in rows) == sorted(f"{w}-{i}" for w in "abcd" for i in range(150))


def test_a_reader_never_cuts_a_row_another_process_is_appending(tmp_path):
    """read_jsonl repairs a torn last line by cutting it; while an appender (here a thread standing in
    for another process) is mid-write, holding the file's flock, the reader waits and then keeps the
    now whole row instead of cutting it and leaving the rest of it as a corrupt line."""
    import fcntl
    import json
    import threading
    import time

    from corp.runtime.runs import append_jsonl, read_jsonl

    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"key": "a"})
    row = (json.dumps({"key": "b", "pad": "x" * 1000}) + "\n").encode()
    started = threading.Event()

    def slow_append():
        with open(path, "ab") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            fh.write(row[:100])
            fh.flush()
            started.set()
            time.sleep(0.5)
            fh.write(row[100:])
            fh.flush()

    t = threading.Thread(target=slow_append)
    t.start()
    started.wait()
    seen = read_jsonl(path, key="key")  # sees a torn tail; must not cut it from under the writer
    t.join()
    assert [r["key"] for r in seen] == ["a"]
    assert [r["key"] for r in read_jsonl(path, key="key", repair=False)] == ["a", "b"]
