"""Cost of `corp analyze-rank`: wall time and peak memory against population size N and model size.

Each configuration runs in a fresh subprocess (peak RSS = ru_maxrss of that child, so runs do not
contaminate each other); rewards are synthetic (timing does not depend on them). Repeats give a
median. The 135M model is timed on a subset of layers (--layers) and the per-layer time is
scaled to 30 layers (stated in the output). Scoring cost for comparison comes from a real
population.jsonl (per-specialist `seconds` + `apply_seconds`).

    nice -n 10 python benchmarks/analyze_rank_cost.py --out results/analyze-rank-cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import numpy as np
sys.path.insert(0, {repo!r})
from corp.analysis.split_half import analyze_population
model, n, splits, perms, layers = {model!r}, {n}, {splits}, {perms}, {layers!r}
if model == "tiny":
    from tests.conftest import make_char_tokenizer, make_tiny_llama
    tok = make_char_tokenizer(); m = make_tiny_llama(tok, hidden=64, layers=2)
    named = [(k, tuple(p.shape)) for k, p in m.named_parameters()]; vocab = len(tok); regex = ".*"
else:
    from corp.analysis.split_half import model_shapes
    _, named, vocab = model_shapes(model); regex = r"layers\.(" + "|".join(map(str, layers)) + r")\."
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rewards = np.random.default_rng(0).standard_normal(n)
t = time.perf_counter()
res = analyze_population(named, list(range(n)), [1e-3] * n, rewards, splits=splits, permutations=perms, vocab_size=vocab, matrices=regex, progress=False)
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "matrices": len(res["matrices"]), "params": sum(a * b for a, b in (m["shape"] for m in res["matrices"])),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_before_mb": rss0 / 1024}}))
"""


def run_child(repo: Path, **kw) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(repo), **kw)], capture_output=True, text=True, env={"CORP_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin"})
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/analyze-rank-cost")
    ap.add_argument("--tiny-n", default="64,256,1024")
    ap.add_argument("--big-n", default="16,64")
    ap.add_argument("--big-model", default="smollm2-135m")
    ap.add_argument("--layers", default="0")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--permutations", type=int, default=20)
    ap.add_argument("--big-splits", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--population", default="runs/arith-pop64/population.jsonl", help="a scored population, for the scoring-cost comparison")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parents[1]
    rows = []
    for n in [int(x) for x in args.tiny_n.split(",") if x]:
        runs = [run_child(repo, model="tiny", n=n, splits=args.splits, perms=args.permutations, layers=[]) for _ in range(args.repeats)]
        rows.append({"model": "tiny-llama h64 x2", "n": n, "splits": args.splits, "permutations": args.permutations, "layers": "all", "matrices": runs[0]["matrices"], "params": runs[0]["params"],
                     "median_s": statistics.median(r["seconds"] for r in runs), "peak_rss_mb": max(r["peak_rss_mb"] for r in runs), "repeats": len(runs)})
        print(rows[-1], flush=True)
    layers = [int(x) for x in args.layers.split(",")]
    for n in [int(x) for x in args.big_n.split(",") if x]:
        runs = [run_child(repo, model=args.big_model, n=n, splits=args.big_splits, perms=args.permutations, layers=layers) for _ in range(max(1, args.repeats - 2))]
        rows.append({"model": args.big_model, "n": n, "splits": args.big_splits, "permutations": args.permutations, "layers": args.layers, "matrices": runs[0]["matrices"], "params": runs[0]["params"],
                     "median_s": statistics.median(r["seconds"] for r in runs), "peak_rss_mb": max(r["peak_rss_mb"] for r in runs), "repeats": len(runs)})
        print(rows[-1], flush=True)
    scoring = None
    pop = repo / args.population
    if pop.exists():
        pr = [json.loads(line) for line in pop.read_text().splitlines() if line.strip()]
        per = [r["seconds"] + r.get("apply_seconds", 0.0) for r in pr if r.get("seed") is not None]
        scoring = {"population": str(args.population), "specialists": len(per), "median_s_per_specialist": statistics.median(per)}
    out = repo / args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(json.dumps({"rows": rows, "scoring": scoring, "command": " ".join(sys.argv)}, indent=2) + "\n")
    print(json.dumps(scoring))


if __name__ == "__main__":
    main()
