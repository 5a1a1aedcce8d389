"""OpenMP defaults for a shared machine (corp/runtime/threads.py): passive waiting unless the user chose."""

from __future__ import annotations

import subprocess
import sys

from corp.runtime.threads import apply_openmp_defaults


def test_wait_policy_is_passive_unless_the_user_chose_one():
    env = {}
    assert apply_openmp_defaults(env) and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for mine in (
        {"OMP_WAIT_POLICY": "ACTIVE"},
        {"GOMP_SPINCOUNT": "300000"},
        {"KMP_BLOCKTIME": "200"},
        {"CORP_OMP_DEFAULTS": "0"},
    ):
        env = dict(mine)
        assert not apply_openmp_defaults(env) and env == mine, mine


def test_importing_corp_sets_the_policy_before_torch_starts_openmp():
    """The variable must be in the environment when torch loads libgomp, i.e. `import corp` first
    (as the CLI does); a fresh interpreter shows it, and leaves a user's choice alone."""
    code = "import os, corp, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    clean = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "CORP_OMP_DEFAULTS")
    }
    assert (
        subprocess.run(
            [sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True
        ).stdout.strip()
        == "PASSIVE"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "OMP_WAIT_POLICY": "ACTIVE"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "ACTIVE"
