"""Issue 57: a local Ray that corp starts leaves nothing behind when it stops: no process (after its
head was killed, the raylet, dashboard and runtime-env agents stayed for 1-2 minutes) and no
session_* directory (one was left in /tmp/ray on every run)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray_cluster, pytest.mark.slow]  # starts a Ray: seconds to tens of seconds


def _running(pids) -> list[int]:
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


def test_a_ray_corp_started_leaves_no_process_and_no_session_even_after_its_head_is_killed():
    import ray

    from corp.runtime import ray_cluster

    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process")
    stop = getattr(ray_cluster, "stop_ray", lambda r: r.shutdown())  # before the fix: Ray's own shutdown
    assert ray_cluster.init_ray(ray, None, 1)
    node = ray._private.worker._global_node
    session = Path(node.get_session_dir_path())
    pids = ray_cluster.ray_pids(node)
    gcs = node.all_processes["gcs_server"][0].process.pid
    os.kill(gcs, signal.SIGKILL)  # the head is lost, as a kill or an OOM leaves it
    t0 = time.monotonic()
    stop(ray)
    assert time.monotonic() - t0 < 30
    assert not ray.is_initialized()
    left = _running(pids)
    assert not left, f"Ray processes still running after stop: {left}"
    assert not session.exists(), f"{session} was left behind"
