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
so no test accuracy needs recomputing; where it is not, the script says so.
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
import math
import re
import statistics
import tempfile
from pathlib import Path
from types import SimpleNamespace

from corp.consolidate.algebra import elite_set
from corp.consolidate.corp_operator import reward_scale
from corp.evaluate import racing
from corp.evaluate.context import EvalCache, RunContext, specialist_what
from corp.runs import read_json, read_jsonl


def full_rows(run_dir: Path) -> list[dict]:
    raw = read_jsonl(run_dir / "population.jsonl", key="key", unique=True)
    if raw and all("index" not in r and "kind" not in r for r in raw):  # an older corp's rows: one per specialist, in population order
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
            row.update(kind="specialist", what=specialist_what(*spec), split=split, index=i, n=1, temperature=0.0,
                       rewards=full["rewards"][lo:hi], correct=full["correct"][lo:hi], answers=full["answers"][lo:hi],
                       prompt_tokens=full["prompt_tokens"] * share, generated_tokens=full["generated_tokens"] * share,
                       seconds=0.0, apply_seconds=0.0, reward_errors=0, status_counts={}, n_examples=hi - lo)
            row["reward"] = sum(row["rewards"]) / (hi - lo)
            row["accuracy"] = sum(row["correct"]) / (hi - lo)
            row["key"] = f"replay|{spec}|{lo}:{hi}"
            out[spec] = cache.put(row)
            assert n == len(ctx.splits["support"])
        return out


def _context(run_dir: Path, rows: list[dict]) -> RunContext:
    n = len(rows[0]["rewards"])
    ids = read_json(run_dir / "splits.json")["support"] if (run_dir / "splits.json").exists() else [f"support-{i}" for i in range(n)]
    assert len(ids) == n, run_dir
    ident = rows[0].get("identity") or {}
    backend = SimpleNamespace(name="replay", model_id=ident.get("model", "replay"), n_params=1)
    task = SimpleNamespace(signature=lambda: ident.get("task"), max_new_tokens=ident.get("max_new_tokens", 0))
    return RunContext(cfg=SimpleNamespace(reward=None, max_new_tokens=ident.get("max_new_tokens")), method="replay", task=task,
                      splits={"support": [SimpleNamespace(id=i) for i in ids]}, run_dir=None, reward_fn=None, _backend=backend,
                      _weights_hash=ident.get("weights_hash", "replay"))


def used(rows: list[dict], top_k: int, quantiles: list[float], who: str) -> set[int]:
    """Specialist indices a method uses from a ranking: RandOpt its top K; CoRP also every elite set."""
    out = {r["index"] for r in rows[:top_k]}
    if who == "corp":
        scaled = reward_scale([r["reward"] for r in rows])
        for q in quantiles:
            out |= {rows[j]["index"] for j in elite_set(scaled, q)}
    return out


def replay(run_dir: Path, first: int, eta: int, ties: str, top_k: int, quantiles: list[float], who: str) -> dict:
    rows = full_rows(run_dir)
    specs = [(r["seed"], r["sigma"]) for r in sorted(rows, key=lambda r: r["index"])]
    n_pop, n = len(specs), len(rows[0]["rewards"])
    keep = top_k if who == "randopt" else max(top_k, math.ceil((1.0 - min(quantiles)) * n_pop) + 1)  # corp.consolidate.run._race_keep
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
    same_rewards = all(abs(r["reward"] - next(f for f in full if f["index"] == r["index"])["reward"]) < 1e-12 for r in ranked if r["index"] in mine)
    tops_same = [r["index"] for r in ranked[:top_k]] == [r["index"] for r in full[:top_k]]
    return {"run": run_dir.name, "population": n_pop, "support": n, "first": first, "eta": eta, "ties": ties, "for": who, "keep": keep,
            "examples": score.examples, "fraction": score.examples / (n_pop * n), "rungs": summary["rungs"], "stopped": summary["stopped"],
            "completed_after_race": before - sum(r.get("kind") == racing.RACED for r in ranked),
            "used_overlap": len(mine & theirs) / len(theirs), "top_k_same_order": tops_same, "identical": mine == theirs and same_rewards and tops_same,
            "full_top": [r["index"] for r in full[:top_k]], "full_mean_reward": statistics.fmean(r["reward"] for r in full)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="glob of population run directories scored in full")
    ap.add_argument("--first", default="8,16", help="first-rung sizes to try")
    ap.add_argument("--eta", type=int, default=2)
    ap.add_argument("--ties", default="keep")
    ap.add_argument("--top-k", type=int, default=3, help="RandOpt's largest K (the race keeps at least K)")
    ap.add_argument("--quantiles", default="0.5", help="CoRP's elite quantiles")
    ap.add_argument("--race-for", default="randopt,corp")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    quantiles = [float(q) for q in args.quantiles.split(",")]
    results = []
    for path in sorted(glob.glob(args.runs)):
        run_dir = Path(path)
        if not (run_dir / "population.jsonl").exists():
            continue
        for who in args.race_for.split(","):
            for first in (int(f) for f in args.first.split(",")):
                res = replay(run_dir, first, args.eta, args.ties, args.top_k, quantiles, who)
                results.append(res)
                print(f"{res['run'][:60]:60s} N={res['population']:3d} n={res['support']:3d} {who:7s} first={first:3d}: "
                      f"{res['fraction']:.2f} of full, rungs {[h['scored'] for h in res['rungs']]}, completed {res['completed_after_race']}, "
                      f"used overlap {res['used_overlap']:.2f}, identical {res['identical']}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
