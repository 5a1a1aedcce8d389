"""Thread defaults for a shared machine (corp/threads.py): passive OpenMP waiting and a thread count
from the free cores, each only where the user decided nothing."""

from __future__ import annotations

import subprocess
import sys

from corp.threads import apply_openmp_defaults, default_threads, other_runnable, run_threads


def test_wait_policy_is_passive_unless_the_user_chose_one():
    env = {}
    assert apply_openmp_defaults(env) and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}, {"KMP_BLOCKTIME": "200"}, {"CORP_OMP_DEFAULTS": "0"}):
        env = dict(mine)
        assert not apply_openmp_defaults(env) and env == mine, mine


def test_importing_corp_sets_the_policy_before_torch_starts_openmp():
    """The variable must be in the environment when torch loads libgomp, i.e. `import corp` first
    (as the CLI does); a fresh interpreter shows it, and leaves a user's choice alone."""
    code = "import os, corp, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    clean = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "CORP_OMP_DEFAULTS")}
    assert subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True).stdout.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], env={**clean, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"


def test_thread_count_leaves_the_cores_others_use(tmp_path):
    assert default_threads(cores=2, others=0) == 2
    assert default_threads(cores=2, others=1) == 1, "a second busy process: one thread, not two fighting over one free core"
    assert default_threads(cores=2, others=9) == 1
    assert default_threads(cores=16, others=3) == 13
    assert 1 <= default_threads(cores=4) <= 4  # measured on this machine
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("11.0 9.0 8.0 3/140 4242\n")  # 3 runnable, one of them the reader
    assert other_runnable(samples=3, interval=0, path=str(loadavg)) == 2
    assert other_runnable(path=str(tmp_path / "missing")) is None


def test_explicit_threads_and_omp_num_threads_win():
    assert run_threads(3, environ={}) == 3
    assert run_threads(None, environ={"OMP_NUM_THREADS": "1"}) is None, "torch already follows OMP_NUM_THREADS"
    assert run_threads(None, environ={}) >= 1
