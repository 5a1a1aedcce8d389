"""Time a finished CoRP bench cell rerun from its caches (issue 13, "Performance": CoRP's "other").

Every evaluation of a finished `corp bench` CoRP cell is cached in its run directory, so rerunning
it generates nothing: what is left is the cell's non-generation work (loading and hashing the
model, building merged directions for the step search and the gates, merge arithmetic, saving the
model). Copies the run directory (without its saved model) and reruns `consolidate` with the
cell's own config.yaml, under whatever corp is on PYTHONPATH, so two checkouts can be compared:

    git worktree add /tmp/before 25486e8^      # before the gates reused the step search's directions
    for code in /tmp/before .; do PYTHONPATH=$code OMP_NUM_THREADS=1 python benchmarks/corp_cell_rerun.py \\
        runs/bench/bench-cpu/arith__corp-stage1__s0__0ac41aeb2ff0 /tmp/rerun-$(basename $code); done
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

import yaml

from corp.config import load_config
from corp.methods import get_method


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a finished CoRP cell's run directory")
    ap.add_argument("scratch", help="where to copy it (replaced)")
    args = ap.parse_args()
    src, dst = Path(args.run_dir), Path(args.scratch)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model"))
    opts = yaml.safe_load((src / "config.yaml").read_text())
    opts.pop("method")
    if opts.get("eval_cache"):  # a copy, so the bench's shared cache is only read
        shutil.copy(opts["eval_cache"], dst / "shared_evals.jsonl")
        opts["eval_cache"] = str(dst / "shared_evals.jsonl")
    method = get_method("consolidate")
    known = {f.name for f in dataclasses.fields(method.config)}
    # an older corp lacks newer options (racing's): drop the ones it does not know
    opts = {k: v for k, v in opts.items() if k in known}
    cfg = load_config(method.config, None, {**opts, "run_dir": str(dst)})
    t0, c0 = time.perf_counter(), time.process_time()
    report = method(cfg)
    print(
        json.dumps(
            {
                "wall_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - c0,
                "accepted": report["corp"].get("accepted"),
            }
        )
    )


if __name__ == "__main__":
    main()
