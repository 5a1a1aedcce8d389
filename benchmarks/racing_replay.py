"""Racing replayed over populations already scored in full (issue 16): what `--race halving` would
have spent and chosen, without generating anything.

A race's decisions depend only on the specialists' per-example rewards on the support prefix it
has seen, and a full population row holds those rewards for every support example. So this script
runs corp's own racing code (`corp.evaluate.racing.race_population` and `complete_needed`, the
functions `corp score --race halving` calls) on a stand-in context whose scorer answers each chunk
from the stored full rows instead of generating it. It reports, per population and race setting:
  - the share of the full population's example evaluations the race would generate
    (FLOPs up to the spread of tokens per example: a row stores its token totals, not per example,
    so each chunk is charged its examples' share of the specialist's totals);
  - whether RandOpt's top-K and CoRP's elite sets (positions a method uses, after the completion
    rule) are the specialists full evaluation chooses, with the same rewards.
Where the choice is identical, the method's result is identical (it is deterministic given them),
so no test accuracy needs recomputing. Where RandOpt's top-1 differs, `--test-rows` (JSONL files of
greedy test rows, e.g. a bench's shared evaluation caches) supplies both specialists' test outcomes
when they were evaluated there, and the script reports raced minus full top-1 test accuracy with
corp's paired bootstrap interval; otherwise it says the test comparison is not available.
Check of the replay against a real raced run: `results/racing` (arith, N = 32, 32 support
examples, first rung 8) measured 0.98 of full FLOPs with the rungs 32 / 31 / 31 scored; replaying
its full run (`--runs runs/bench-racing/full --first 8 --race-for randopt --top-k 1,4`) must give
the same rungs.

    python benchmarks/racing_replay.py --runs 'runs/bench/bench-cpu/*__population__*' --first 8,16 --out results/racing-replay
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import tempfile
from pathlib import Path
from types import SimpleNamespace

from corp.methods.consolidate.run import _race_keep, _used_rows
from corp.evaluate import racing
from corp.runtime.context import EvalCache, RunContext, specialist_what
from corp.runtime.runs import read_json, read_jsonl
from corp.algorithms.stats import compare_paired


def full_rows(run_dir: Path) -> list[dict]:
    raw = read_jsonl(run_dir / "population.jsonl", key="key", unique=True)
    if raw and all(
        "index" not in r and "kind" not in r for r in raw
    ):  # an older corp's rows: one per specialist, in population order
        raw = [{**r, "index": i, "kind": "specialist", "n_examples": len(r["rewards"])} for i, r in enumerate(raw)]
    rows = [r for r in racing.latest_rows(raw) if r.get("kind") == "specialist"]
    n = max(r["n_examples"] for r in rows)
    return [r for r in rows if r["n_examples"] == n]


class _Replay:
    """A stand-in for score_specialists: each chunk's rows are cut from the full rows."""

    def __init__(self, rows: list[dict]):
        self.by_spec = {(r["seed"], r["sigma"]): r for r in rows}
        self.examples = 0

    def __call__(self, ctx, specs, split, cache, desc=None, indices=None):
        lo, hi = map(int, re.fullmatch(r"support\[(\d+):(\d+)\]", split).groups())
        out = {}
        for spec, i in zip(specs, indices):
            full = self.by_spec[spec]
            n, share = len(full["rewards"]), (hi - lo) / len(full["rewards"])
            self.examples += hi - lo
            row = {k: full[k] for k in ("seed", "sigma", "identity") if k in full}
            row.update(
                kind="specialist",
                what=specialist_what(*spec),
                split=split,
                index=i,
                n=1,
                temperature=0.0,
                rewards=full["rewards"][lo:hi],
                correct=full["correct"][lo:hi],
                answers=full["answers"][lo:hi],
                prompt_tokens=full["prompt_tokens"] * share,
                generated_tokens=full["generated_tokens"] * share,
                seconds=0.0,
                apply_seconds=0.0,
                reward_errors=0,
                status_counts={},
                n_examples=hi - lo,
            )
            row["reward"] = sum(row["rewards"]) / (hi - lo)
            row["accuracy"] = sum(row["correct"]) / (hi - lo)
            row["key"] = f"replay|{spec}|{lo}:{hi}"
            out[spec] = cache.put(row)
            assert n == len(ctx.splits["support"])
        return out


def _context(run_dir: Path, rows: list[dict]) -> RunContext:
    n = len(rows[0]["rewards"])
    ids = (
        read_json(run_dir / "splits.json")["support"]
        if (run_dir / "splits.json").exists()
        else [f"support-{i}" for i in range(n)]
    )
    assert len(ids) == n, run_dir
    ident = rows[0].get("identity") or {}
    backend = SimpleNamespace(
        name="replay", model_id=ident.get("model", "replay"), n_params=1, context_length=None
    )  # generates nothing
    task = SimpleNamespace(signature=lambda: ident.get("task"), max_new_tokens=ident.get("max_new_tokens", 0))
    return RunContext(
        cfg=SimpleNamespace(reward=None, max_new_tokens=ident.get("max_new_tokens")),
        method="replay",
        task=task,
        splits={"support": [SimpleNamespace(id=i) for i in ids]},
        run_dir=None,
        reward_fn=None,
        _backend=backend,
        _weights_hash=ident.get("weights_hash", "replay"),
    )


def used(rows: list[dict], top_k: int, quantiles: list[float], who: str) -> set[int]:
    """Specialist indices a method uses from a ranking: RandOpt its top K; CoRP also every elite set
    (corp.methods.consolidate.run._used_rows, which the real race's completion rule reads)."""
    if who == "randopt":
        return {r["index"] for r in rows[:top_k]}
    return {rows[j]["index"] for j in _used_rows(_corp(top_k, quantiles, len(rows)), rows)}


def _corp(top_k: int, quantiles: list[float], n: int) -> SimpleNamespace:
    """The fields of a ConsolidateConfig that _used_rows and _race_keep read."""
    return SimpleNamespace(top_k=[top_k], quantiles=quantiles, population=n)


def test_rows(pattern: str | None) -> dict[tuple, dict]:
    """(seed, sigma, ids_hash) -> a greedy test row, from JSONL files of evaluation rows."""
    out = {}
    for path in [p for g in pattern.split(",") for p in sorted(glob.glob(g))] if pattern else []:
        for r in read_jsonl(Path(path)):
            if r.get("split") == "test" and r.get("seed") is not None and float(r.get("temperature", 0.0)) == 0.0:
                out[(r["seed"], r["sigma"])] = out.get((r["seed"], r["sigma"])) or r
    return out


def top1_on_test(raced_top: dict, full_top: dict, tests: dict) -> dict | None:
    """Raced minus full top-1 test accuracy with its paired interval, when both were evaluated on the same test examples."""
    a, b = tests.get((raced_top["seed"], raced_top["sigma"])), tests.get((full_top["seed"], full_top["sigma"]))
    if a is None or b is None or a.get("ids_hash") != b.get("ids_hash"):
        return None
    c = compare_paired("raced top-1", a["correct"], "full top-1", b["correct"])
    return {
        "raced": c["accuracy_a"],
        "full": c["accuracy_b"],
        "difference": c["difference"],
        "ci95": c["ci95"],
        "n": c["n"],
    }


def replay(
    run_dir: Path,
    first: int,
    eta: int,
    ties: str,
    top_k: int,
    quantiles: list[float],
    who: str,
    tests: dict | None = None,
) -> dict:
    rows = full_rows(run_dir)
    specs = [(r["seed"], r["sigma"]) for r in sorted(rows, key=lambda r: r["index"])]
    n_pop, n = len(specs), len(rows[0]["rewards"])
    keep = top_k if who == "randopt" else _race_keep(_corp(top_k, quantiles, n_pop))
    ctx = _context(run_dir, rows)
    score = _Replay(rows)
    with tempfile.TemporaryDirectory() as tmp:
        cache = EvalCache(Path(tmp) / "replay.jsonl")
        raced, summary = racing.race_population(ctx, specs, cache, keep, first, eta, score, ties)
        ranked = sorted(raced, key=lambda r: (-r["reward"], r["index"]))

        def need(rs):
            idx = used(rs, top_k, quantiles, who)
            return [j for j, r in enumerate(rs) if r["index"] in idx]

        before = sum(r.get("kind") == racing.RACED for r in ranked)
        ranked = racing.complete_needed(ctx, ranked, need, cache, score)
        ranked.sort(key=lambda r: (-r["reward"], r["index"]))
    full = sorted(rows, key=lambda r: (-r["reward"], r["index"]))
    mine, theirs = used(ranked, top_k, quantiles, who), used(full, top_k, quantiles, who)
    same_rewards = all(
        abs(r["reward"] - next(f for f in full if f["index"] == r["index"])["reward"]) < 1e-12
        for r in ranked
        if r["index"] in mine
    )
    tops_same = [r["index"] for r in ranked[:top_k]] == [r["index"] for r in full[:top_k]]
    top1_same = ranked[0]["index"] == full[0]["index"]
    return {
        "run": run_dir.name,
        "population": n_pop,
        "support": n,
        "first": first,
        "eta": eta,
        "ties": ties,
        "for": who,
        "keep": keep,
        "examples": score.examples,
        "fraction": score.examples / (n_pop * n),
        "rungs": summary["rungs"],
        "stopped": summary["stopped"],
        "completed_after_race": before - sum(r.get("kind") == racing.RACED for r in ranked),
        "used_overlap": len(mine & theirs) / len(theirs),
        "top_k_same_order": tops_same,
        "identical": mine == theirs and same_rewards and tops_same,
        "top1_same": top1_same,
        "top1_test": None if top1_same else top1_on_test(ranked[0], full[0], tests or {}),
        "full_top": [r["index"] for r in full[:top_k]],
        "full_mean_reward": statistics.fmean(r["reward"] for r in full),
    }


def _top1_text(r: dict) -> str:
    if r["top1_same"]:
        return "same top-1"
    t = r["top1_test"]
    if t is None:
        return "other top-1; not evaluated on test"
    return (
        f"{t['raced']:.3f} - {t['full']:.3f} = {t['difference']:+.3f} (95% "
        f"CI {t['ci95'][0]:+.3f} to {t['ci95'][1]:+.3f}, n = {t['n']})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs", required=True, help="globs (comma-separated) of population run directories scored in full"
    )
    ap.add_argument("--first", default="8,16", help="first-rung sizes to try")
    ap.add_argument("--eta", type=int, default=2)
    ap.add_argument("--ties", default="keep")
    ap.add_argument("--top-k", type=int, default=3, help="RandOpt's largest K (the race keeps at least K)")
    ap.add_argument("--quantiles", default="0.5", help="CoRP's elite quantiles")
    ap.add_argument("--race-for", default="randopt,corp")
    ap.add_argument(
        "--test-rows",
        default=None,
        help="glob of JSONL files with greedy test rows (e.g. a bench's *shared_evals.jsonl)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    quantiles = [float(q) for q in args.quantiles.split(",")]
    tests = test_rows(args.test_rows)
    results = []
    for path in [p for pattern in args.runs.split(",") for p in sorted(glob.glob(pattern))]:
        run_dir = Path(path)
        if not (run_dir / "population.jsonl").exists():
            continue
        for who in args.race_for.split(","):
            for first in (int(f) for f in args.first.split(",")):
                res = replay(run_dir, first, args.eta, args.ties, args.top_k, quantiles, who, tests)
                results.append(res)
                print(
                    f"{res['run'][:60]:60s} N={res['population']:3d} n={res['support']:3d} {who:7s} "
                    f"first={first:3d}: {res['fraction']:.2f} of full, rungs "
                    f"{[h['scored'] for h in res['rungs']]}, completed {res['completed_after_race']}, "
                    f"used overlap {res['used_overlap']:.2f}, identical {res['identical']}"
                )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = f"replay-ties-{args.ties}"
        (out / f"{name}.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
        lines = [
            f"Made by `python benchmarks/racing_replay.py --runs '{args.runs}' --first {args.first} --eta {args.eta} "
            f"--ties {args.ties} --top-k {args.top_k} --quantiles {args.quantiles} --race-for {args.race_for}"
            + (f" --test-rows '{args.test_rows}'" if args.test_rows else "")
            + f" --out {args.out}`.",
            "",
            "| population | N | support | raced for | first rung | share of full evaluations | scored per rung | "
            "completed | used overlap | same choice | top-1 on test: raced - full |",
            "|---|---:|---:|---|---:|---:|---|---:|---:|---|---|",
        ]
        for r in results:
            task, _, rest = r["run"].partition("__population__")
            lines.append(
                f"| {task[:18] + ' ' + rest if rest else task} | {r['population']} | "
                f"{r['support']} | {r['for']} | {r['first']} | {r['fraction']:.2f} | "
                f"{'/'.join(str(h['scored']) for h in r['rungs'])} | {r['completed_after_race']} | "
                f"{r['used_overlap']:.2f} | {'yes' if r['identical'] else 'no'} | {_top1_text(r)} |"
            )
        (out / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
