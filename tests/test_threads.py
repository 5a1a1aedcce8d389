"""OpenMP defaults (corp/runtime/threads.py): a short spin on idle cores, passive waiting on busy ones,
nothing where the user chose."""

from __future__ import annotations

import subprocess
import sys

from corp.runtime.threads import CHOSEN_ENV, SPIN_COUNT, apply_openmp_defaults, busy_cores, cpu_times

PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE", CHOSEN_ENV: "OMP_WAIT_POLICY"}


def test_wait_policy_follows_the_cores_unless_the_user_chose_one():
    env = {}
    assert apply_openmp_defaults(env, busy=lambda: 0.9) == "OMP_WAIT_POLICY" and env == PASSIVE
    env = {}
    spin = {"GOMP_SPINCOUNT": SPIN_COUNT, CHOSEN_ENV: "GOMP_SPINCOUNT"}
    assert apply_openmp_defaults(env, busy=lambda: 0.1) == "GOMP_SPINCOUNT" and env == spin
    env = {}  # cores that cannot be read: the safe choice
    assert apply_openmp_defaults(env, busy=lambda: None) == "OMP_WAIT_POLICY" and env == PASSIVE
    for mine in (
        {"OMP_WAIT_POLICY": "ACTIVE"},
        {"GOMP_SPINCOUNT": "300000"},
        {"KMP_BLOCKTIME": "200"},
        {"CORP_OMP_DEFAULTS": "0"},
    ):
        env = dict(mine)
        assert apply_openmp_defaults(env, busy=lambda: 0.0) is None and env == mine, mine


def test_a_child_of_a_corp_process_waits_passively_without_looking():
    """A Ray worker, a client or a command a test runs inherits its corp parent's choice: it is one of several
    processes at work, so it waits passively (spinning children made a test file of Ray and federated runs
    take 45 s against 28 s), and does not probe the cores. A user's own variable beside it is still kept."""
    looked = []
    env = {"GOMP_SPINCOUNT": SPIN_COUNT, CHOSEN_ENV: "GOMP_SPINCOUNT"}
    assert apply_openmp_defaults(env, busy=lambda: looked.append(1) or 0.0) == "OMP_WAIT_POLICY"
    assert env == PASSIVE and looked == []
    env = {"GOMP_SPINCOUNT": SPIN_COUNT, CHOSEN_ENV: "GOMP_SPINCOUNT", "KMP_BLOCKTIME": "200"}
    assert apply_openmp_defaults(env, busy=lambda: 0.0) is None and env == {
        CHOSEN_ENV: "GOMP_SPINCOUNT",
        "KMP_BLOCKTIME": "200",
    }


def test_busy_cores_reads_other_work_from_proc_stat(tmp_path, monkeypatch):
    """Busy = every jiffy but idle and iowait (guest time is inside user already), as cores' worth."""
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 50 50 1000 20 0 0 10 30 0\ncpu0 1 2 3\n")
    assert cpu_times(str(stat)) == (210, 1230)
    assert cpu_times(str(tmp_path / "missing")) is None
    samples = iter([(210, 1230), (310, 1430)])  # 100 busy of 200 jiffies on 2 cores: one core busy
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert busy_cores(0.0, read=lambda: next(samples)) == 1.0
    assert busy_cores(0.0, read=lambda: None) is None


def test_importing_corp_sets_the_policy_before_torch_starts_openmp():
    """The variable must be in the environment when torch loads libgomp, i.e. `import corp` first
    (as the CLI does); a fresh interpreter shows it, and leaves a user's choice alone."""
    code = "import os, corp, torch; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    clean = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "CORP_OMP_DEFAULTS", CHOSEN_ENV)
    }
    assert subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True
    ).stdout.split() in (["PASSIVE", "None"], ["None", SPIN_COUNT])
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "OMP_WAIT_POLICY": "ACTIVE"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["ACTIVE", "None"]


def test_a_run_records_the_wait_setting_it_ran_with(tmp_path, monkeypatch):
    """run_status.json says which OpenMP wait setting the run had and who chose it: the setting moves generation's
    speed by 1.3-1.5x, so a timing is read beside it."""
    import json
    import os

    import corp.runtime.threads as threads
    from corp.runtime.runs import write_status

    monkeypatch.setattr(threads, "_CHOSEN", {})
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "CORP_OMP_DEFAULTS", CHOSEN_ENV):
        monkeypatch.setenv(k, "")  # records the variable's state, so teardown restores it whatever the test sets
        monkeypatch.delenv(k)
    assert apply_openmp_defaults(busy=lambda: 0.0) == "GOMP_SPINCOUNT"
    write_status(tmp_path, "running")
    status = json.loads((tmp_path / "run_status.json").read_text())
    assert status["openmp"] == {"GOMP_SPINCOUNT": SPIN_COUNT, "chosen_by": "corp at import", "busy_cores_at_start": 0.0}
    monkeypatch.setattr(threads, "_CHOSEN", {})
    del os.environ["GOMP_SPINCOUNT"]
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert apply_openmp_defaults(busy=lambda: 0.0) is None
    assert threads.wait_setting() == {"OMP_WAIT_POLICY": "ACTIVE", "chosen_by": "the environment"}
