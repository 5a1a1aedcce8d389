"""Racing vs full evaluation of one population (issue 16): selection quality and population FLOPs.

Scores the same population twice on the embedded model: in full (every specialist on every support
example) and raced (`--race halving`, corp.evaluate.racing). For RandOpt (top-1 and K-vote) and for
CoRP's elite sets it reports:
  - population FLOPs of the raced run over the full one (the compute ledger: tokens generated);
  - overlap of the chosen top-K and of the elite sets with the full-evaluation choice;
  - test accuracy of RandOpt top-1 and K-vote from each, with the paired interval raced vs full;
  - CoRP: whether the elite sets and their rewards are identical (then CoRP's consolidation,
    deterministic given them, is identical too; otherwise CoRP would need its own runs, marked).
Both runs share one evaluation cache (`--eval-cache`), so a specialist chosen by both is evaluated
on test once.

    python benchmarks/racing.py --population 32 --n-support 64 --n-test 128 --top-k 1,4 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from corp.methods.randopt import randopt_results
from corp.config import load_config
from corp.algorithms.corp_operator.algebra import elite_set
from corp.methods.consolidate.config import ConsolidateConfig
from corp.algorithms.corp_operator.stage1 import reward_scale
from corp.methods.consolidate.run import _race_keep, _used_rows
from corp.runtime.context import open_run, run_evals
from corp.evaluate.scorer import ensure_population, rows_ledger
from corp.algorithms.stats import compare_paired


def elites(rows: list[dict], q: float) -> set[int]:
    r = reward_scale([x["reward"] for x in rows])
    return {rows[i]["index"] for i in elite_set(r, q)}


def population(cfg: ConsolidateConfig, need) -> tuple[list[dict], dict, float, dict, object]:
    with open_run(cfg, "consolidate", needs=("support", "test")) as ctx:
        t0 = time.perf_counter()
        ranked = ensure_population(
            ctx,
            keep=_race_keep(cfg) if need == "corp" else max(cfg.top_k),
            need=(lambda rows: _used_rows(cfg, rows)) if need == "corp" else (lambda rows: range(max(cfg.top_k))),
        )
        seconds = time.perf_counter() - t0
        flops = rows_ledger(ctx, ranked).flops
        results, _ = randopt_results(ctx, ranked, cfg.top_k, run_evals(ctx))
        return (
            ranked,
            {r.method: r for r in results},
            seconds,
            {"flops": flops, **(ctx.population_source or {})},
            ctx.example_ids("test"),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--reward", default=None, help="reward function (default: the task's check)")
    ap.add_argument("--population", type=int, default=32)
    ap.add_argument("--n-support", type=int, default=64)
    ap.add_argument("--n-test", type=int, default=128)
    ap.add_argument("--top-k", default="1,4")
    ap.add_argument("--quantiles", default="0.5,0.9", help="CoRP elite quantiles to compare (0.5 is corp's default)")
    ap.add_argument("--race-first", type=int, default=8)
    ap.add_argument("--race-eta", type=int, default=2)
    ap.add_argument(
        "--race-ties",
        default="keep",
        help="keep (ties with the last kept go on) or order (ties broken by population order)",
    )
    ap.add_argument(
        "--race-for",
        default="randopt,corp",
        help="which methods' needs to race for (randopt: its top K; corp: its elites and top K)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", default="runs/bench-racing")
    ap.add_argument("--out", default="results/racing")
    args = ap.parse_args()
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = dict(
        model=args.model,
        task=args.task,
        population=args.population,
        n_support=args.n_support,
        n_probe=0,
        n_validation=0,
        n_test=args.n_test,
        top_k=args.top_k,
        quantiles=args.quantiles,
        seed=args.seed,
        threads=args.threads,
        reward=args.reward,
        eval_cache=str(work / "shared_evals.jsonl"),
        sigmas="5e-4,1e-3,2e-3",  # the grid results/racing was measured on (corp's default is now auto)
    )

    def cfg(name, **kw):
        return load_config(ConsolidateConfig, None, {**common, "run_dir": str(work / name), **kw})

    race = dict(race="halving", race_first=args.race_first, race_eta=args.race_eta, race_ties=args.race_ties)
    full_rows, full_res, full_s, full_pop, ids = population(cfg("full"), "randopt")
    runs = {name: population(cfg(f"raced-{name}", **race), name) for name in args.race_for.split(",")}
    kmax = max(int(k) for k in args.top_k.split(","))
    top_full = [r["index"] for r in full_rows[:kmax]]
    report = {
        "command": "python benchmarks/racing.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "full": {"population_flops": full_pop["flops"], "seconds": full_s},
        "raced": {},
    }
    lines = [
        f"# Racing vs full evaluation: {args.model}, {args.task}, N = {args.population}, "
        f"{args.n_support} support examples, {args.n_test} test examples",
        "",
        f"Made by `{report['command']}`. Successive halving: first rung {args.race_first} "
        f"examples, eta {args.race_eta}, ties {args.race_ties}; every specialist a method "
        "uses is scored on the whole support split (corp.evaluate.racing).",
        "",
        "| raced for | population FLOPs vs full | stopped / completed after race | "
        "top-K overlap | elite overlap (q) | test: raced vs full (paired 95% CI) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, (rows, res, secs, pop, _) in runs.items():
        ratio = pop["flops"] / full_pop["flops"]
        top = [r["index"] for r in rows[:kmax]]
        overlap = len(set(top) & set(top_full)) / kmax
        el = {}
        for q in (float(x) for x in args.quantiles.split(",")):
            a, b = elites(rows, q), elites(full_rows, q)
            full_idx = {r["index"] for r in rows if r.get("kind") == "specialist"}
            el[q] = {
                "overlap": len(a & b) / max(1, len(b)),
                "identical": a == b
                and all(
                    next(r for r in rows if r["index"] == i)["reward"]
                    == next(r for r in full_rows if r["index"] == i)["reward"]
                    for i in a
                ),
                "all_full": a <= full_idx,
            }
        cmp = {
            m: compare_paired(f"{m} raced", res[m].correct, f"{m} full", full_res[m].correct)
            for m in full_res
            if m != "base"
        }
        race_info = pop.get("race", {})
        report["raced"][name] = {
            "population_flops": pop["flops"],
            "flops_ratio": ratio,
            "seconds": secs,
            "race": race_info,
            "completed_after_race": pop.get("completed_after_race"),
            "topk_overlap": overlap,
            "elites": {str(q): v for q, v in el.items()},
            "test": {
                m: {"raced": c["accuracy_a"], "full": c["accuracy_b"], "difference": c["difference"], "ci95": c["ci95"]}
                for m, c in cmp.items()
            },
        }
        tests = "; ".join(
            f"{m} {c['accuracy_a']:.3f} vs {c['accuracy_b']:.3f} "
            f"({c['difference']:+.3f}, {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f})"
            for m, c in cmp.items()
        )
        els = ", ".join(f"{v['overlap']:.2f} (q={q}{', identical' if v['identical'] else ''})" for q, v in el.items())
        lines.append(
            f"| {name} | {ratio:.2f} | {race_info.get('stopped')} / "
            f"{pop.get('completed_after_race')} | {overlap:.2f} | {els} | {tests} |"
        )
    (out / "racing.json").write_text(json.dumps(report, indent=2))
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
