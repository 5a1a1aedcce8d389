"""Where each method's wall time goes in a finished `corp bench` (issue 13, "Performance").

Reads the bench's cell records (RESULTS/cells/*.json) and the run directories they name, and splits
each method's wall time into:
  generation   seconds of the evaluations the method computed itself (rows of evals.jsonl and of its
               population file; a row copied from the bench's shared cache, `shared_from`, was computed
               by another cell and counts there);
  apply        setting a specialist or merged direction on the weights (`apply_seconds` of those rows);
  training     ES iterations and GRPO steps (metrics.jsonl `seconds`: their sampling, scoring and updates);
  noise math   CoRP's Gram matrix and the building of its merged directions (the report's
               corp.seconds `gram` + `merge`: regenerating every specialist's noise);
  save         CoRP materialising and saving the consolidated model and its recipe (corp.seconds `save`);
  other        the rest of the cell's wall: model loading and hashing, CoRP's arithmetic where its
               report has no timings (runs made before they were recorded), reports.
A record whose run directory is not there (run directories are not committed: an earlier session's
cells) is left out and counted as such, since its wall would all read as 'other'. Every run directory counts once, a population cell's tries over the budget included (each ran the
method in a run directory of its own, listed in the record's `tried`): the cells that share one (an iterative run continued across
budgets, a fixed cell serving both data settings) contribute the largest wall any of them
recorded (an iterative record's wall is cumulative). Trials (setting `tune`) and final cells are
summed per method, with their counts. The shared population of each seed (scored once by `corp
score`, read by RandOpt and CoRP) is its own line. A stage that is not generation or training and
takes more than 10% of its method's time is flagged.

    python benchmarks/bench_stages.py --results results/bench-cpu-2 [--config configs/bench-cpu-2.yaml]
        [--root DIR_THE_BENCH_RAN_IN]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from corp.runtime.runs import read_jsonl

STAGES = ("generation", "apply", "training", "noise math", "save")
FLAGGED = ("apply", "noise math", "save", "other")


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
    corp_seconds = {}
    report = run_dir / "report.json"
    if report.exists():
        corp_seconds = (json.loads(report.read_text()).get("corp") or {}).get("seconds") or {}
    return {
        "generation": sum(float(r.get("seconds", 0.0)) for r in rows),
        "apply": sum(float(r.get("apply_seconds", 0.0)) for r in rows),
        "training": training,
        "noise math": float(corp_seconds.get("gram", 0.0)) + float(corp_seconds.get("merge", 0.0)),
        "save": float(corp_seconds.get("save", 0.0)),
    }


def stage_table(records: list[dict], root: Path) -> list[str]:
    """The markdown table's lines for these cell records (run directories relative to `root`)."""
    walls: dict[tuple, dict[str, float]] = defaultdict(dict)  # (task, method) -> {run_dir: wall}
    stage_dirs: dict[tuple, set] = defaultdict(set)  # every run directory the walls paid for
    counts: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    populations: dict[str, set] = defaultdict(set)
    for rec in records:
        if rec.get("status") != "done":
            continue
        key = (rec.get("task_label") or rec["task"][:24], rec["label"])
        d = rec["run_dir"]
        if not (root / d).is_dir():  # an earlier session's cell: its record, not its run directory, is committed
            counts[key]["absent"] += 1  # its wall would all read as 'other': left out, and said
            continue
        counts[key]["trials" if rec["setting"] == "tune" else "final"] += 1
        walls[key][d] = max(walls[key].get(d, 0.0), float(rec["wall_seconds"]))
        # a population cell's wall includes its tries over the budget, each a run directory of its own
        stage_dirs[key] |= {d} | {t["run_dir"] for t in rec.get("tried") or [] if t.get("run_dir")}
        if rec.get("population_run"):
            populations[key[0]].add(rec["population_run"])
    lines = [
        "| task | method | cells (trials + final) | wall s | generation | apply | training | noise math | save | other "
        "| flagged (>10%, not generation/training) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def pct(x, w):
        return f"{100 * x / w:.0f}%" if w > 0 else "-"

    for key in sorted(counts):
        if key not in walls:  # every record of the method was absent
            lines.append(
                f"| {key[0]} | {key[1]} | 0 + 0 ({counts[key]['absent']} without run directory) | - |" + " - |" * 7
            )
            continue
        st = defaultdict(float)
        for d in stage_dirs[key]:
            for k, v in run_dir_stages(root / d).items():
                st[k] += v
        wall = sum(walls[key].values())
        st["other"] = max(0.0, wall - sum(st[k] for k in STAGES))
        flags = [k for k in FLAGGED if wall > 0 and st[k] / wall > 0.10]
        c = counts[key]
        absent = f" ({c['absent']} without run directory, not counted)" if c["absent"] else ""
        lines.append(
            f"| {key[0]} | {key[1]} | {c['trials']} + {c['final']}{absent} | {wall:.0f} | "
            + " | ".join(pct(st[k], wall) for k in (*STAGES, "other"))
            + f" | {', '.join(flags)} |"
        )
    for task, dirs in sorted(populations.items()):
        st = defaultdict(float)
        for d in dirs:
            for k, v in run_dir_stages(root / d).items():
                st[k] += v
        total = st["generation"] + st["apply"]
        lines.append(
            f"| {task} | population (shared, {len(dirs)} runs) | - | {total:.0f} | {pct(st['generation'], total)} | "
            f"{pct(st['apply'], total)} | - | - | - | - | {'apply' if total and st['apply'] / total > 0.10 else ''} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="the bench's results directory (results/NAME)")
    ap.add_argument("--root", default=".", help="directory the bench ran in (its run directories are relative to it)")
    ap.add_argument("--out", default=None, help="write the table here (default: RESULTS/stages.md)")
    ap.add_argument(
        "--config",
        default=None,
        help="the bench's YAML: count only the records of its planned cells (not records a changed config left behind)",
    )
    args = ap.parse_args()
    root, results = Path(args.root), Path(args.results)
    paths = sorted((results / "cells").glob("*.json"))
    if args.config:
        from corp.bench.sweep import Bench, load_bench_config, plan

        cfg = load_bench_config(args.config)
        cells, _ = plan(cfg)
        bench = Bench(cfg)
        bench.cells = cells
        planned = {r.record_name() for c in cells if (r := bench.resolve(c, cells)) is not None}
        paths = [p for p in paths if p.name in planned]
    # a record's file name starts with its task's label (corp.bench.sweep.Cell.record_name)
    records = [{"task_label": p.name.split("__")[0], **json.loads(p.read_text())} for p in paths]
    text = "\n".join(stage_table(records, root)) + "\n"
    out = Path(args.out) if args.out else results / "stages.md"
    out.write_text(
        f"# Where the time went: `{results.name}`\n\nMade by `python benchmarks/bench_stages.py --results "
        f"{args.results}` from the cells' run directories.\n"
        "Per method, summed over trials, seeds, settings and budgets, each run directory once; `noise math` is "
        "CoRP's Gram matrix and merged directions (regenerating its specialists' noise), `save` CoRP "
        "materialising and saving its model, `other` the cell's wall minus the measured stages (model loading "
        "and hashing, reports, and CoRP's arithmetic in runs whose report has no timings).\n\n" + text
    )
    print(text)


if __name__ == "__main__":
    main()
