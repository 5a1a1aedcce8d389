"""Time and peak memory of CoRP's exact Gram matrix for one tensor (corp.algorithms.corp_operator.algebra.gram_matrix),
against what the memory check counts for it (corp.runtime.models.memory.gram_work_gb).

    python benchmarks/gram_memory.py [--seeds 94] [--shape 151936x1536] [--budget-gb 1] [--threads 1]

Defaults: the 1.5B model's embedding (233M elements) and L's seed-0 elite count. Runs in a child process (peak
RSS from getrusage, so nothing this process holds is counted) and prints seconds, peak RSS, the check's figure
for one worker, and the draws' share (each seed's noise is drawn once: seeds x elements normals).
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def child(seeds: int, shape: tuple[int, ...], budget_gb: float, threads: int) -> None:
    import torch

    from corp.algorithms.corp_operator.algebra import gram_matrix
    from corp.algorithms.perturb.noise import derive_seeds

    torch.set_num_threads(threads)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    gram_matrix([("w", shape)], derive_seeds("gram-memory", 0, n=seeds), budget_gb, progress=False)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"seconds": seconds, "peak_gb": peak, "before_gb": base}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=94)
    ap.add_argument("--shape", default="151936x1536")
    ap.add_argument("--budget-gb", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    shape = tuple(int(d) for d in args.shape.split("x"))
    res = subprocess.run(
        [sys.executable, __file__, "--child", str(args.seeds), args.shape, str(args.budget_gb), str(args.threads)],
        capture_output=True,
        text=True,
    )
    if res.returncode:
        sys.exit(res.stderr[-2000:])
    got = json.loads(res.stdout.strip().splitlines()[-1])
    from corp.runtime.models.memory import GB, gram_work_gb

    n = 1
    for d in shape:
        n *= d
    counted = gram_work_gb([n], args.budget_gb, 1, args.seeds)
    print(
        f"{args.seeds} seeds, one {args.shape} tensor ({n / 1e6:.1f}M elements), budget {args.budget_gb:g} GiB, "
        f"{args.threads} thread(s): {got['seconds']:.1f} s ({args.seeds * n / got['seconds'] / 1e6:.0f}M normals/s "
        f"drawn and multiplied), peak RSS {got['peak_gb']:.2f} GB ({got['peak_gb'] - got['before_gb']:.2f} over "
        f"the process before the Gram; the check counts {counted:.2f} GB of work, 1 GB = {GB:.0e} bytes)"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), tuple(int(d) for d in sys.argv[3].split("x")), float(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
