"""The Ray executor on a two-node loopback cluster (`ray.cluster_utils.Cluster`, every node on
127.0.0.1): a killed node leaves the run complete with the local run's rows; a lost head is one
line, the run is recorded as interrupted and a later run resumes exactly; a path missing on a
node is one line naming the node and the path. Each test takes tens of seconds (marker ray_cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from corp import CorpError  # noqa: E402
from corp.evaluate.scorer import ensure_population  # noqa: E402
from corp.runtime import ray_cluster  # noqa: E402
from corp.runtime.context import setup_run  # noqa: E402
from corp.runtime.runs import read_jsonl  # noqa: E402
from tests.test_ray_executor import (  # noqa: E402, F401
    cfg_for,
    population_in_background,
    strip_timing,
    tiny_dir,
    wait_rows,
)

pytestmark = [pytest.mark.ray_cluster, pytest.mark.slow]  # a two-node loopback cluster: tens of seconds a test
ROOT = Path(__file__).resolve().parents[1]


def loopback_cluster(head_cpus: int, worker_cpus: int):
    from ray.cluster_utils import Cluster

    for attempt in range(3):  # Ray gives a node 30 s to register; on a loaded 2-core machine that can run out
        with ray_cluster.loopback():
            cluster = Cluster()
            try:
                cluster.add_node(num_cpus=head_cpus, node_ip_address="127.0.0.1", include_dashboard=False)
                worker = cluster.add_node(num_cpus=worker_cpus, node_ip_address="127.0.0.1")
                return cluster, worker
            except Exception:
                cluster.shutdown()
                if attempt == 2:
                    raise


def test_relative_paths_are_made_absolute_for_the_nodes(tmp_path, monkeypatch, tiny_dir):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    (tmp_path / "rw.py").write_text("def f(completion, answer):\n    return 1.0\n")
    os.symlink(tiny_dir, tmp_path / "m")
    cfg = cfg_for(tmp_path / "run", "m", task="jsonl:d.jsonl:prompt=prompt", reward="rw.py:f", data=None)
    changes, paths = ray_cluster.node_paths(cfg)
    assert changes["model"] == str(Path(tiny_dir).resolve())
    assert changes["task"] == f"jsonl:{tmp_path / 'd.jsonl'}:prompt=prompt"
    assert changes["reward"] == f"{tmp_path / 'rw.py'}:f"
    assert {changes["model"], str(tmp_path / "d.jsonl"), str(tmp_path / "rw.py")} <= set(paths)


def test_a_killed_node_leaves_the_run_complete_with_the_local_rows(tmp_path, tiny_dir):  # noqa: F811
    kw = dict(n_support=16, max_new_tokens=16)
    local = ensure_population(setup_run(cfg_for(tmp_path / "local", tiny_dir, **kw), "randopt"))
    cluster, worker = loopback_cluster(1, 1)
    try:
        with ray_cluster.loopback():  # a loopback address stays loopback (corp's init_ray does this too)
            cluster.connect()
        # a path a node lacks is one line naming the node and the path, before any work
        with pytest.raises(CorpError, match=r"node 127\.0\.0\.1 .*'/nonexistent/model'"):
            ray_cluster.check_nodes_have(ray, ["/nonexistent/model"])
        ctx = setup_run(cfg_for(tmp_path / "ray", tiny_dir, executor="ray", workers=2, **kw), "randopt")
        from corp.runtime.executors import get_executor

        ex = get_executor(ctx)
        on_worker = [ray.get(ex.actors[s].info.remote())["node_id"] == worker.node_id for s in range(2)]
        assert sorted(on_worker) == [False, True], "one actor per node"
        t, out = population_in_background(ctx)
        wait_rows(tmp_path / "ray" / "population.jsonl", 1)
        cluster.remove_node(worker, allow_graceful=False)  # its actor has no node left to restart on
        t.join(600)
        assert "error" not in out, out.get("error")
        stats = ctx.population_source["executor"]
        assert stats["workers_alive"] == 1 and stats["retried_shards"] >= 1, stats
        ctx.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert strip_timing(out["rows"]) == strip_timing(local)
    assert len(read_jsonl(tmp_path / "ray" / "population.jsonl", key="key")) == len(local), "each row once"


SCORE_OPTIONS = dict(task="arith", population=8, sigmas="0.05,0.1", n_support=16, max_new_tokens=16)


def corp_score(run_dir: Path, model: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "corp.cli", "score", "--model", str(model)]
    for k, v in SCORE_OPTIONS.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    args += ["--threads", "1", "--run-dir", str(run_dir), "--executor", "ray", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CORP_NO_PROGRESS": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_lost_head_is_one_line_and_a_later_run_resumes_exactly(tmp_path, tiny_dir):  # noqa: F811
    from corp.config import load_config
    from corp.methods import REGISTRY

    options = dict(SCORE_OPTIONS, model=str(tiny_dir), threads=1, run_dir=str(tmp_path / "local"))
    local = ensure_population(setup_run(load_config(REGISTRY["score"].config, None, options), "score"))
    cluster, _worker = loopback_cluster(1, 1)
    run_dir = tmp_path / "ray"
    try:
        proc = corp_score(run_dir, tiny_dir, "--ray-address", cluster.address, "--workers", "2")
        wait_rows(run_dir / "population.jsonl", 2)
        assert proc.poll() is None, proc.communicate()
        cluster.head_node.kill_gcs_server()  # the head machine goes: its GCS and its raylet
        cluster.head_node.kill_raylet()
        try:
            _, err = proc.communicate(timeout=45)  # Ray alone would spin for 60 s, then end the process
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the driver did not stop within 45 s of losing the head")
    finally:
        cluster.shutdown()
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "head" in lines[0] and "rerun" in lines[0], err
    assert json.loads((run_dir / "run_status.json").read_text())["status"] == "interrupted"
    before = {r["key"] for r in read_jsonl(run_dir / "population.jsonl", key="key")}
    assert 0 < len(before) < len(local)
    # a later run (corp's own local Ray this time) scores only the rest
    again = corp_score(run_dir, tiny_dir, "--workers", "2")
    _, err2 = again.communicate(timeout=600)
    assert again.returncode == 0, err2
    rows = read_jsonl(run_dir / "population.jsonl", key="key")
    assert strip_timing(rows) == strip_timing(local) and len(rows) == len(local)
    assert json.loads((run_dir / "run_status.json").read_text())["status"] == "complete"
