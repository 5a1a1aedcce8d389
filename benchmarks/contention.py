"""Specialists per hour on an idle machine vs beside a second CPU-bound process, old vs new thread defaults.

Issue 16: two torch threads collapsed when another process shared the 2 cores. corp now sets
OpenMP's wait policy to passive (corp/runtime/threads.py).
This benchmark scores specialists through the real scorer (`setup_run` + `ensure_population`,
embedded model, the task's support split) in a fresh child process per measurement, because the
OpenMP settings are read once when the runtime starts. Configurations:

  old         libgomp's default spinning (GOMP_SPINCOUNT=300000, its documented default, which
              also tells corp to leave the wait policy alone) and torch's default thread count
              (all usable cores): what corp did before;
  new         corp's defaults: nothing set by the user (passive waiting, torch's thread count);
  passive-1t  passive waiting with one thread (a thread count cut to the free cores);
  spin-1t     default spinning with one thread.

Conditions: `idle` (nothing started by the benchmark) and `contended` (a competitor started
before the child and stopped after it: `busy`, one pure-Python busy loop; or `torch`, a torch
matmul loop with torch's default threads and spinning, i.e. another torch job as it ran before).
Configurations and conditions are interleaved rep by rep (order reversed on odd reps), so a
change in background load hits all of them alike. Per child: the median of the per-specialist
seconds the scorer records (apply + generate + reward). Reported: median over reps, specialists
per hour, contended / idle per configuration, and new-contended / old-idle. The load average
before and after and the runnable-task count before each child are recorded: on a machine that
is not otherwise idle, "idle" means "without the benchmark's competitor".

    python benchmarks/contention.py --n-support 16 --population 2 --reps 3 --out results/contention
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    # env changes (None: remove the variable) and --threads (None: corp's default; "cores": all usable cores,
    # torch's default)
    "old": ({"GOMP_SPINCOUNT": "300000", "OMP_WAIT_POLICY": None}, "cores"),
    "new": ({"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None}, None),
    "passive-1t": ({"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "PASSIVE"}, 1),
    "spin-1t": ({"GOMP_SPINCOUNT": "300000", "OMP_WAIT_POLICY": None}, 1),
    # short spins: a thread waits this many iterations at a barrier before it sleeps
    "spin-10k": ({"GOMP_SPINCOUNT": "10000", "OMP_WAIT_POLICY": None}, "cores"),
    "spin-1k": ({"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": None}, "cores"),
}
# variables that would fix the child's threads or policy from the benchmark's own environment
CLEARED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_BLOCKTIME", "CORP_OMP_DEFAULTS")


def child(spec: dict) -> None:
    """One measurement: score `population` specialists and print one JSON line."""
    import corp  # noqa: F401  (applies corp's OpenMP defaults before torch loads, as the CLI does)
    import torch

    from corp.config import PopulationConfig, load_config
    from corp.runtime.context import setup_run
    from corp.evaluate.scorer import ensure_population

    tmp = tempfile.mkdtemp(prefix="contention-")
    cfg = load_config(
        PopulationConfig,
        None,
        dict(
            model=spec["model"],
            task=spec["task"],
            population=spec["population"],
            sigmas=str(spec["sigma"]),
            seed=spec["seed"],
            n_support=spec["n_support"],
            n_probe=0,
            n_validation=0,
            n_test=0,
            run_dir=tmp,
            threads=spec["threads"],
            max_new_tokens=spec["max_new_tokens"],
        ),
    )
    ctx = setup_run(cfg, "bench", needs=("support",))
    _ = ctx.backend.n_params  # load the model before timing
    rows = ensure_population(ctx)
    per = [r["seconds"] + r["apply_seconds"] for r in rows]
    print(
        json.dumps(
            {
                "threads": torch.get_num_threads(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                "s_per_specialist": statistics.median(per),
                "all_s": per,
            }
        ),
        flush=True,
    )


def busy_loop() -> None:
    while True:
        pass


def torch_loop() -> None:
    import torch  # torch's defaults: all cores, libgomp spinning (the benchmark clears corp's variables)

    a = torch.randn(256, 256)
    while True:
        a = torch.tanh(a @ a)


def runnable_others() -> int | None:
    """Runnable tasks other than this one: the kernel's instantaneous count in /proc/loadavg's
    'running/total' field (which counts the reader), the median of 5 samples; None off Linux."""
    counts = []
    for _ in range(5):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
        time.sleep(0.02)
    return max(0, int(statistics.median(counts)) - 1)


def start_competitor(kind: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED + ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["GOMP_SPINCOUNT"] = "300000"
    proc = subprocess.Popen([sys.executable, __file__, "--competitor", kind], env=env)
    time.sleep(2.0)  # let it start (torch import) and reach its loop
    return proc


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        proc.terminate()
        proc.wait()


def run_child(config: str, args) -> dict:
    env_changes, threads = CONFIGS[config]
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    for k, v in env_changes.items():
        env.pop(k, None)
        if v is not None:
            env[k] = v
    env["CORP_NO_PROGRESS"] = "1"
    if threads == "cores":
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    spec = dict(
        model=args.model,
        task=args.task,
        population=args.population,
        sigma=args.sigma,
        seed=args.seed,
        n_support=args.n_support,
        threads=threads,
        max_new_tokens=args.max_new_tokens,
    )
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"child {config} failed:\n{out.stderr[-3000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["wall_s"] = time.perf_counter() - t0
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--n-support", type=int, default=16)
    ap.add_argument(
        "--population", type=int, default=2, help="specialists per measurement (the median of their seconds is taken)"
    )
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="generation length (default: the task's)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--configs", default="old,new,passive-1t", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--competitor", default=None, help=argparse.SUPPRESS)  # internal: run the competitor loop
    ap.add_argument(
        "--kind",
        default="busy",
        choices=("busy", "torch"),
        help="the competing process: a Python busy loop or a torch matmul loop",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one measurement
    ap.add_argument("--out", default=None, help="directory for results.json")
    args = ap.parse_args()
    # a terminated benchmark stops its competitor and child (the finally blocks run on SystemExit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.competitor:
        busy_loop() if args.competitor == "busy" else torch_loop()
        return
    if args.child:
        child(json.loads(args.child))
        return
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"error: unknown --configs {unknown}; choose from {', '.join(CONFIGS)}")
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    results = []
    for rep in range(args.reps):
        conditions = ["idle", "contended"] if rep % 2 == 0 else ["contended", "idle"]
        for condition in conditions:
            order = configs if rep % 2 == 0 else configs[::-1]
            for config in order:
                others = runnable_others()
                comp = start_competitor(args.kind) if condition == "contended" else None
                try:
                    row = run_child(config, args)
                finally:
                    stop(comp)
                row.update(
                    rep=rep,
                    condition=condition,
                    config=config,
                    runnable_others_before=others,
                    loadavg_1min=os.getloadavg()[0],
                )
                results.append(row)
                print(
                    json.dumps(
                        {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k != "all_s"}
                    ),
                    flush=True,
                )
    load_after = os.getloadavg()
    print(f"load average after: {load_after}", flush=True)

    summary = {}
    for config in configs:
        for condition in ("idle", "contended"):
            secs = [r["s_per_specialist"] for r in results if r["config"] == config and r["condition"] == condition]
            med = statistics.median(secs)
            summary[f"{config}/{condition}"] = {
                "s_per_specialist_median": round(med, 2),
                "specialists_per_hour": round(3600 / med, 1),
                "threads": sorted(
                    {r["threads"] for r in results if r["config"] == config and r["condition"] == condition}
                ),
            }
        summary[f"{config}/contended_over_idle"] = round(
            summary[f"{config}/idle"]["s_per_specialist_median"]
            / summary[f"{config}/contended"]["s_per_specialist_median"],
            3,
        )
    if "old" in configs and "new" in configs:
        summary["new_contended_over_old_idle"] = round(
            summary["old/idle"]["s_per_specialist_median"] / summary["new/contended"]["s_per_specialist_median"], 3
        )
    print(
        "\n| configuration | idle s/spec | idle spec/h | contended s/spec | "
        "contended spec/h | contended / idle | threads (idle; contended) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for config in configs:
        i, c = summary[f"{config}/idle"], summary[f"{config}/contended"]
        print(
            f"| {config} | {i['s_per_specialist_median']} | {i['specialists_per_hour']} | "
            f"{c['s_per_specialist_median']} | {c['specialists_per_hour']} | "
            f"{summary[f'{config}/contended_over_idle']} | {i['threads']}; {c['threads']} |"
        )
    if "new_contended_over_old_idle" in summary:
        print(f"\nnew defaults under contention / old defaults idle: {summary['new_contended_over_old_idle']}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(args).items() if k not in ("child", "competitor")},
                    "load_before": load_before,
                    "load_after": load_after,
                    "cores": len(os.sched_getaffinity(0)),
                    "rows": results,
                    "summary": summary,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
