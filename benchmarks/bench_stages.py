"""Where each method's wall time goes in a finished `corp bench` (issue 13, "Performance").

Reads the bench's cell records (RESULTS/cells/*.json) and the run directories they name, and splits
each method's wall time into:
  generation   seconds of the evaluations the method computed itself (rows of evals.jsonl and of its
               population file; a row copied from the bench's shared cache, `shared_from`, was computed
               by another cell and counts there);
  apply        setting a specialist or merged direction on the weights (`apply_seconds` of those rows);
  training     ES iterations and GRPO steps (metrics.jsonl `seconds`: their sampling, scoring and updates);
  other        the rest of the cell's wall: model loading and hashing, CoRP's Gram matrix and merge
               arithmetic, saving models, reports.
The shared population of each seed (scored once by `corp score`, read by RandOpt and CoRP) is its
own line. A stage that is not generation or training and takes more than 10% of its method's time
is flagged. Iterative cells of one seed share one run directory across budgets, so a method's
figures are per (task, setting, seed) and summed over seeds.

    python benchmarks/bench_stages.py --results results/bench-cpu [--root DIR_THE_BENCH_RAN_IN]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from corp.runs import read_jsonl


def own_rows(path: Path) -> list[dict]:
    """The rows a run directory computed itself (a row copied from the shared cache counts where it was computed)."""
    return [r for r in read_jsonl(path, key="key", repair=False, unique=True) if not r.get("shared_from")]


def run_dir_stages(run_dir: Path) -> dict:
    # ES's specialists (population.jsonl, kind es-specialist) are scored inside its iterations: training
    rows = own_rows(run_dir / "evals.jsonl") + [
        r for r in own_rows(run_dir / "population.jsonl") if not str(r.get("kind", "")).startswith("es-")
    ]
    metrics = read_jsonl(run_dir / "metrics.jsonl", repair=False)  # read-only: never cut another run's file
    training = sum(
        float(m.get("seconds", 0.0)) for m in {m.get("iteration", m.get("step")): m for m in metrics}.values()
    )
    return {
        "generation": sum(float(r.get("seconds", 0.0)) for r in rows),
        "apply": sum(float(r.get("apply_seconds", 0.0)) for r in rows),
        "training": training,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="the bench's results directory (results/NAME)")
    ap.add_argument("--root", default=".", help="directory the bench ran in (its run directories are relative to it)")
    ap.add_argument("--out", default=None, help="write the table here (default: RESULTS/stages.md)")
    args = ap.parse_args()
    root, results = Path(args.root), Path(args.results)
    records = [json.loads(p.read_text()) for p in sorted((results / "cells").glob("*.json"))]
    walls: dict[tuple, float] = defaultdict(float)
    dirs: dict[tuple, set] = defaultdict(set)
    populations: set[str] = set()
    iterative_wall: dict[tuple, float] = {}
    for rec in records:
        if rec.get("status") != "done":
            continue
        key = (rec["task"], rec["label"])
        if rec["kind"] == "iterative":  # cumulative over budgets: the largest budget's record holds the whole run
            k = (rec["task"], rec["label"], rec["setting"], rec["seed"])
            iterative_wall[k] = max(iterative_wall.get(k, 0.0), float(rec["wall_seconds"]))
        elif rec["kind"] == "fixed" and rec["setting"] != "paper":
            continue  # the same run directory as the paper setting's (computed once)
        else:
            walls[key] += float(rec["wall_seconds"])
        dirs[key].add(rec["run_dir"])
        if rec.get("population_run"):
            populations.add(rec["population_run"])
    for (task, label, _setting, _seed), w in iterative_wall.items():
        walls[(task, label)] += w
    table = []
    for key in sorted(walls):
        st = defaultdict(float)
        for d in dirs[key]:
            for k, v in run_dir_stages(root / d).items():
                st[k] += v
        wall = walls[key]
        st["other"] = max(0.0, wall - st["generation"] - st["apply"] - st["training"])
        table.append((key[0], key[1], wall, st))
    pop_by_task: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for d in populations:
        task = next((r["task"] for r in records if r.get("population_run") == d), "?")
        for k, v in run_dir_stages(root / d).items():
            pop_by_task[task][k] += v
    lines = [
        "| task | method | wall s | generation | apply | training | other | flagged (>10%, not generation/training) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]

    def pct(x, w):
        return f"{100 * x / w:.0f}%" if w > 0 else "-"

    for task, label, wall, st in table:
        flags = [k for k in ("apply", "other") if wall > 0 and st[k] / wall > 0.10]
        lines.append(
            f"| {task[:24]} | {label} | {wall:.0f} | {pct(st['generation'], wall)} | {pct(st['apply'], wall)} | "
            f"{pct(st['training'], wall)} | {pct(st['other'], wall)} | {', '.join(flags)} |"
        )
    for task, st in sorted(pop_by_task.items()):
        total = st["generation"] + st["apply"]
        lines.append(
            f"| {task[:24]} | population (shared, {len([d for d in populations])} runs) | {total:.0f} | "
            f"{pct(st['generation'], total)} | {pct(st['apply'], total)} | - | - | "
            f"{'apply' if total and st['apply'] / total > 0.10 else ''} |"
        )
    text = "\n".join(lines) + "\n"
    out = Path(args.out) if args.out else results / "stages.md"
    out.write_text(
        f"# Where the time went: `{results.name}`\n\nMade by `python benchmarks/bench_stages.py --results "
        f"{args.results}` from the cells' run directories.\n"
        "Per method, summed over seeds, settings and budgets; `other` is the "
        "cell's wall minus the measured stages (model loading and hashing, "
        "CoRP's Gram matrix and merge arithmetic, saving models, reports).\n\n" + text
    )
    print(text)


if __name__ == "__main__":
    main()
