"""The Ray executor under faults, on a two-node loopback Ray cluster (issue 37).

One population (S specialists of a tiny random Llama on `arith`), scored by `--executor ray` with
2 workers on a cluster of two nodes of 1 CPU each (`ray.cluster_utils.Cluster`, every socket on
127.0.0.1), four ways, each on a fresh cluster and run directory:

- `fault-free`: the reference wall time;
- `worker-killed`: the worker process of one actor SIGKILLed after a few rows (Ray restarts the
  actor and retries its shard);
- `node-killed`: the second node removed after a few rows (its actor has no node left: the other
  actor takes its shards);
- `head-killed`: the head's GCS and raylet killed after a few rows (the driver stops with one line,
  the run is interrupted), then a fresh cluster and the same run directory (the resume): wall
  time is both runs, the cluster restart included.

For each: whether the rows are complete and identical to a local run of the same config (timing
fields aside), each key written once, the restarts and retried shards the executor counted, and the
wall time against the fault-free run. The load average is recorded (a shared machine moves the
figures).

    python benchmarks/ray_faults.py --specialists 32 --out results/ray-faults
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("CORP_NO_PROGRESS", "1")
os.environ["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")  # the Ray workers' corp


def tiny_model(where: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import make_char_tokenizer, make_tiny_llama

    from corp.runtime.models import save_model

    tok = make_char_tokenizer()
    d = where / "tiny-llama"
    save_model(make_tiny_llama(tok, hidden=64), tok, d)
    return d


def config(run_dir: Path, model: Path, specialists: int, **kw):
    from corp.config import RandOptConfig, load_config

    options = dict(
        model=str(model),
        task="arith",
        population=specialists,
        sigmas="0.05,0.1",
        n_support=12,
        n_validation=0,
        n_test=4,
        max_new_tokens=16,
        threads=1,
        run_dir=str(run_dir),
    )
    return load_config(RandOptConfig, None, {**options, **kw})


def strip(rows) -> dict:
    from corp.runtime.context import TIMING_FIELDS

    return {r["key"]: {k: v for k, v in r.items() if k not in (*TIMING_FIELDS, "index")} for r in rows}


def cluster():
    from ray.cluster_utils import Cluster

    from corp.runtime.ray_cluster import loopback

    for attempt in range(3):  # Ray gives a node 30 s to register: a loaded machine can miss it
        with loopback():
            c = Cluster()
            try:
                c.add_node(num_cpus=1, node_ip_address="127.0.0.1", include_dashboard=False)
                worker = c.add_node(num_cpus=1, node_ip_address="127.0.0.1")
                return c, worker
            except Exception:
                c.shutdown()
                if attempt == 2:
                    raise


def rows_on_disk(run_dir: Path) -> list[dict]:
    from corp.runtime.runs import read_jsonl

    path = run_dir / "population.jsonl"
    return read_jsonl(path, key="key", repair=False) if path.exists() else []


def scenario(name: str, model: Path, work: Path, specialists: int, after_rows: int) -> dict:
    """One scored population on a fresh loopback cluster, with the fault `name` after `after_rows` rows."""
    import ray

    from corp.runtime.context import setup_run
    from corp.runtime.executors import get_executor
    from corp.runtime.ray_cluster import loopback
    from corp.evaluate.scorer import ensure_population

    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    c, worker = cluster()
    t0 = time.perf_counter()
    with loopback():
        c.connect()
    ctx = setup_run(config(run_dir, model, specialists, executor="ray", workers=2), "randopt")
    ex = get_executor(ctx)
    victim = ex.pids()[1]  # asked before the run: a busy actor answers only between shards
    out: dict = {}

    def run():
        try:
            out["rows"] = ensure_population(ctx)
        except BaseException as exc:  # noqa: BLE001 -- reported below
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    if name != "fault-free":
        while len(rows_on_disk(run_dir)) < after_rows and t.is_alive():
            time.sleep(0.05)
        if name == "worker-killed":
            os.kill(victim, 9)
        elif name == "node-killed":
            c.remove_node(worker, allow_graceful=False)
        elif name == "head-killed":
            c.head_node.kill_gcs_server()
            c.head_node.kill_raylet()
    t.join()
    stats = dict(ex.stats())
    interrupted = type(out.get("error")).__name__ if "error" in out else None
    ctx.close()
    ray.shutdown()
    c.shutdown()
    resumed = None
    if name == "head-killed":  # the head is back (a fresh cluster): the same command resumes
        before = len(rows_on_disk(run_dir))
        c, _ = cluster()
        with loopback():
            c.connect()
        ctx = setup_run(config(run_dir, model, specialists, executor="ray", workers=2), "randopt")
        ensure_population(ctx)
        resumed = {"rows_before": before, "scored_on_resume": len(rows_on_disk(run_dir)) - before}
        stats = {
            k: v + ctx.population_source["executor"].get(k, 0) if k in ("actor_restarts", "retried_shards") else v
            for k, v in stats.items()
        }
        ctx.close()
        ray.shutdown()
        c.shutdown()
    wall = time.perf_counter() - t0
    return {
        "scenario": name,
        "wall_s": round(wall, 1),
        "interrupted_by": interrupted,
        "resume": resumed,
        "actor_restarts": stats.get("actor_restarts"),
        "retried_shards": stats.get("retried_shards"),
        "workers_alive": stats.get("workers_alive"),
        "rows": rows_on_disk(run_dir),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specialists", type=int, default=32)
    ap.add_argument("--after-rows", type=int, default=6, help="rows written before the fault")
    ap.add_argument("--out", default="results/ray-faults")
    ap.add_argument("--only", default="fault-free,worker-killed,node-killed,head-killed")
    args = ap.parse_args()
    from corp.runtime.context import setup_run
    from corp.evaluate.scorer import ensure_population

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="ray-faults-"))
    model = tiny_model(work)
    t0 = time.perf_counter()
    local = strip(ensure_population(setup_run(config(work / "local", model, args.specialists), "randopt")))
    local_s = time.perf_counter() - t0
    results = []
    for name in args.only.split(","):
        r = scenario(name, model, work, args.specialists, args.after_rows)
        rows = r.pop("rows")
        r["rows_written"] = len(rows)
        r["complete"] = set(strip(rows)) == set(local)
        r["identical_to_local"] = strip(rows) == local
        r["each_once"] = len({x["key"] for x in rows}) == len(rows)
        results.append(r)
        print(json.dumps(r), flush=True)
    base = next((r["wall_s"] for r in results if r["scenario"] == "fault-free"), None)
    for r in results:
        r["overhead_vs_fault_free"] = round(r["wall_s"] / base - 1, 3) if base else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "specialists": args.specialists,
        "rows_expected": len(local),
        "local_wall_s": round(local_s, 1),
        "cluster": "2 loopback nodes x 1 CPU (ray.cluster_utils.Cluster), 2 workers, --threads 1",
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))


if __name__ == "__main__":
    main()
