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


def child(spec: dict) -> None:
    """One configuration, run in its own process (`--child JSON`): prints one JSON line."""
    import resource
    import time

    import numpy as np

    sys.path.insert(0, spec["repo"])
    from corp.methods.analyze_rank.rank_stats import analyze_population

    if spec["model"] == "tiny":
        from tests.conftest import make_char_tokenizer, make_tiny_llama

        tok = make_char_tokenizer()
        m = make_tiny_llama(tok, hidden=64, layers=2)
        named, vocab, regex = [(k, tuple(p.shape)) for k, p in m.named_parameters()], len(tok), ".*"
    else:
        from corp.methods.analyze_rank.split_half import model_shapes

        _, named, vocab = model_shapes(spec["model"])
        regex = r"layers\.(" + "|".join(map(str, spec["layers"])) + r")\."
    n = spec["n"]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if spec.get("power_sims"):  # the power simulation alone, on the shapes of the analysed matrices
        from corp.methods.analyze_rank.power import analysis_power
        from corp.methods.analyze_rank.rank_stats import analysis_targets

        targets, _ = analysis_targets(named, vocab, False, regex)
        sigmas = [(5e-4, 1e-3, 2e-3)[i % 3] for i in range(n)]
        t, cpu = time.perf_counter(), time.process_time()
        p = analysis_power(
            [s for _, s in targets],
            sigmas,
            spec["splits"],
            spec["perms"],
            [1, 2, 4, 8, 16, 32],
            0.05,
            sims=spec["power_sims"],
        )
        print(
            json.dumps(
                {
                    "seconds": time.perf_counter() - t,
                    "cpu_s": time.process_time() - cpu,
                    "shapes": [
                        [s["shape"], s["matrices"], s["power_at_full_share"], s["share_at_target"], s["seconds"]]
                        for s in p["shapes"]
                    ],
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }
            )
        )
        return
    rewards = np.random.default_rng(0).standard_normal(n)
    t, cpu = time.perf_counter(), time.process_time()
    res = analyze_population(
        named,
        list(range(n)),
        [1e-3] * n,
        rewards,
        splits=spec["splits"],
        permutations=spec["perms"],
        vocab_size=vocab,
        matrices=regex,
        progress=False,
    )
    dt = time.perf_counter() - t
    print(
        json.dumps(
            {
                "seconds": dt,
                "cpu_s": time.process_time() - cpu,
                "matrices": len(res["matrices"]),
                "params": sum(a * b for a, b in (m["shape"] for m in res["matrices"])),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_before_mb": rss0 / 1024,
            }
        )
    )


def run_child(repo: Path, **kw) -> dict:
    spec = json.dumps({"repo": str(repo), **kw})
    out = subprocess.run(
        [sys.executable, __file__, "--child", spec],
        capture_output=True,
        text=True,
        env={"CORP_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin"},
    )
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: one configuration in a fresh process
    ap.add_argument("--out", default="results/analyze-rank-cost")
    ap.add_argument("--tiny-n", default="64,256,1024")
    ap.add_argument("--big-n", default="16,64")
    ap.add_argument("--big-model", default="smollm2-135m")
    ap.add_argument("--layers", default="0")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--permutations", type=int, default=20)
    ap.add_argument("--big-splits", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--power-n",
        default="",
        help="also time the power simulation alone at these N (big model, --layers, S = --splits, P = --permutations)",
    )
    ap.add_argument("--power-sims", type=int, default=32)
    ap.add_argument(
        "--population",
        default="runs/arith-pop64/population.jsonl",
        help="a scored population, for the scoring-cost comparison",
    )
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    repo = Path(__file__).resolve().parents[1]
    rows = []
    for n in [int(x) for x in args.tiny_n.split(",") if x]:
        runs = [
            run_child(repo, model="tiny", n=n, splits=args.splits, perms=args.permutations, layers=[])
            for _ in range(args.repeats)
        ]
        rows.append(
            {
                "model": "tiny-llama h64 x2",
                "n": n,
                "splits": args.splits,
                "permutations": args.permutations,
                "layers": "all",
                "matrices": runs[0]["matrices"],
                "params": runs[0]["params"],
                "median_s": statistics.median(r["seconds"] for r in runs),
                "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                "repeats": len(runs),
            }
        )
        print(rows[-1], flush=True)
    layers = [int(x) for x in args.layers.split(",")]
    for n in [int(x) for x in args.big_n.split(",") if x]:
        runs = [
            run_child(repo, model=args.big_model, n=n, splits=args.big_splits, perms=args.permutations, layers=layers)
            for _ in range(max(1, args.repeats - 2))
        ]
        rows.append(
            {
                "model": args.big_model,
                "n": n,
                "splits": args.big_splits,
                "permutations": args.permutations,
                "layers": args.layers,
                "matrices": runs[0]["matrices"],
                "params": runs[0]["params"],
                "median_s": statistics.median(r["seconds"] for r in runs),
                "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                "repeats": len(runs),
            }
        )
        print(rows[-1], flush=True)
    for n in [int(x) for x in args.power_n.split(",") if x]:
        r = run_child(
            repo,
            model=args.big_model,
            n=n,
            splits=args.splits,
            perms=args.permutations,
            layers=layers,
            power_sims=args.power_sims,
        )
        rows.append(
            {
                "model": args.big_model,
                "what": "power simulation",
                "n": n,
                "splits": args.splits,
                "permutations": args.permutations,
                "layers": args.layers,
                "power_sims": args.power_sims,
                "median_s": r["seconds"],
                "cpu_s": r["cpu_s"],
                "peak_rss_mb": r["peak_rss_mb"],
                "shapes": r["shapes"],
                "repeats": 1,
            }
        )
        print(rows[-1], flush=True)
    scoring = None
    pop = repo / args.population
    if pop.exists():
        pr = [json.loads(line) for line in pop.read_text().splitlines() if line.strip()]
        per = [r["seconds"] + r.get("apply_seconds", 0.0) for r in pr if r.get("seed") is not None]
        scoring = {
            "population": str(args.population),
            "specialists": len(per),
            "median_s_per_specialist": statistics.median(per),
        }
    out = repo / args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(
        json.dumps({"rows": rows, "scoring": scoring, "command": " ".join(sys.argv)}, indent=2) + "\n"
    )
    print(json.dumps(scoring))


if __name__ == "__main__":
    main()
