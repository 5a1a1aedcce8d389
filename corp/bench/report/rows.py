"""The bench's numbers before any text: one flat row per (cell, report row) (results.csv), the
label-prior reference rows, the configured comparisons with their per-seed status, the tuning rows
and trials' FLOPs, the CoRP paper's ratio comparisons and the equivalence tests."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from corp.algorithms.stats import compare_paired_seeds, seed_example_interval, tost_from
from corp.bench.accounting import eval_flops
from corp.bench.config import (
    BenchConfig,
    at_budget,
    headline_setting,
)
from corp.bench.records import CellRecord, Comparison
from corp.evaluate.tasks import SplitSizes, get_task, make_splits
from corp.evaluate.tasks.coding import CodeTask
from corp.runtime.runs import atomic_write_text

CSV_COLUMNS = [
    "task",
    "task_label",
    "method",
    "setting",
    "budget",
    "seed",
    "accuracy",
    "passes_per_example",
    "labelled_examples",
    "test_tokens",
    "test_flops",
    "flops",
    "wall_seconds",
    "population_seconds",
    "units",
    "status",
    "hyperparameters",
]


def flat_rows(records: list[CellRecord]) -> list[dict]:
    out = []
    for rec in records:
        if not rec["rows"]:
            out.append(
                {
                    "task": rec["task"],
                    "method": rec["label"],
                    "cell": rec["label"],
                    "setting": rec["setting"],
                    "budget": rec["budget"],
                    "seed": rec["seed"],
                    "accuracy": None,
                    "passes_per_example": None,
                    "labelled_examples": None,
                    "test_tokens": None,
                    "test_flops": None,
                    "flops": rec["flops"],
                    "wall_seconds": rec["wall_seconds"],
                    "units": rec.get("units"),
                    "status": f"{rec['status']}: {rec.get('reason', '')}",
                    "hyperparameters": json.dumps(rec.get("hyperparameters", {}), sort_keys=True, default=str),
                    "correct": None,
                    "ids": None,
                    "tuned": bool(rec.get("tuning")),
                }
            )
        for r in rec["rows"]:
            status = rec["status"]
            if rec.get("detail", {}).get("accepted") is False:
                status = "abstained (= base)"
            if rec.get("budget_reached") is False:
                status += "; budget not reached"
            out.append(
                {
                    "task": rec["task"],
                    "method": r["name"],
                    "cell": rec["label"],
                    "setting": rec["setting"],
                    "budget": rec["budget"],
                    "seed": rec["seed"],
                    "accuracy": r["accuracy"],
                    "passes_per_example": r["passes_per_example"],
                    "labelled_examples": r["labelled_examples"],
                    "test_tokens": r["test_tokens"],
                    "test_flops": r["test_flops"],
                    # a RandOpt row on CoRP's population is charged the prefix CoRP read (population_rows)
                    "flops": r.get("flops", rec["flops"]),
                    "wall_seconds": rec["wall_seconds"],
                    "population_seconds": rec.get("population_seconds"),
                    "units": rec.get("units"),
                    "status": status,
                    "hyperparameters": json.dumps(rec.get("hyperparameters", {}), sort_keys=True, default=str),
                    "correct": r.get("correct"),
                    "ids": rec.get("example_ids"),
                    # the greedy base comes with self-consistency's cell and uses none of its tuned options
                    "tuned": bool(rec.get("tuning")) and r["name"] != "base",
                }
            )
    return out


LABEL_PRIOR = "majority-answer"


def label_prior_rows(cfg: BenchConfig, tasks: list[str]) -> list[dict]:
    """A reference row per task, not a method: the most common gold answer among the labelled examples
    (support + probe + validation, the equal-data 144), given to every test example and checked by the
    task's own `check`. It is what learning only the label prior scores: on a task whose answers are
    mostly one value (letter counting over 1-3 words: 78% of the test answers are '1') a method can gain
    a lot by answering that value more often, and the table should show it. One row per seed (the value
    is the same) so it reads as every other row; no model, 0 FLOPs. Skipped for tasks whose check runs
    code, and for any task that cannot be loaded here (its package missing)."""

    out = []
    for task in tasks:
        try:
            t = get_task(task, cfg.data)
            if isinstance(t, CodeTask):
                continue
            sp = make_splits(t, SplitSizes(cfg.n_support, cfg.n_probe, cfg.n_validation, cfg.n_test), cfg.split_seed)
        except Exception:  # noqa: BLE001 - a reference row is optional; the cells' rows do not depend on it
            continue
        labelled = sp["support"] + sp["probe"] + sp["validation"]
        if not labelled or not sp["test"]:
            continue
        counts: dict[str, int] = {}
        for ex in labelled:
            counts[ex.answer] = counts.get(ex.answer, 0) + 1
        answer = max(counts, key=lambda a: (counts[a], -list(counts).index(a)))  # ties: the first seen
        correct = [int(t.check(answer, ex)) for ex in sp["test"]]
        for seed in cfg.seeds_of(task):
            out.append(
                {
                    "task": task,
                    "method": LABEL_PRIOR,
                    "cell": LABEL_PRIOR,
                    "setting": headline_setting(cfg),
                    "budget": None,
                    "seed": seed,
                    "accuracy": sum(correct) / len(correct),
                    "passes_per_example": 0,
                    "labelled_examples": len(labelled),
                    "test_tokens": 0,
                    "test_flops": 0.0,
                    "flops": 0.0,
                    "wall_seconds": 0.0,
                    "units": None,
                    "status": f"reference: answer {answer!r} to every test example (no model)",
                    "answer": answer,
                    "hyperparameters": "{}",
                    "correct": correct,
                    "ids": [ex.id for ex in sp["test"]],
                    "tuned": False,
                }
            )
    return out


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _cells_of(rows: list[dict], task: str, name: str) -> set[str]:
    """The cell labels behind row `name` (a RandOpt row's cell is 'randopt'); a row that only ever
    failed is named by its cell label, so the name itself then."""
    return {r["cell"] for r in rows if r["method"] == name and r["task"] == task} or {name}


def _cell_of(rows: list[dict], task: str, name: str) -> str:
    """The cell label behind row `name` (one of them: the cells of one row share a method's seeds)."""
    return min(_cells_of(rows, task, name))


def _seed_status(rows: list[dict], task: str, setting: str, budget, name: str, seed: int) -> str:
    """Why row `name` has no outcome in one seed at one budget: its cell's status ('does not fit: ...'), or
    'not run yet'."""
    cells = _cells_of(rows, task, name)
    for r in rows:
        if (
            r["task"] == task
            and r["setting"] == setting
            and r["seed"] == seed
            and r["cell"] in cells
            and (r["budget"] == budget or r["budget"] is None)
            and r["accuracy"] is None
        ):
            return str(r["status"]).split(":")[0]
    return "not run yet"


def comparisons(cfg: BenchConfig, rows: list[dict]) -> list[Comparison]:
    """The configured comparisons, on the seeds where both rows exist; every planned seed left out is named,
    with why (a side that does not fit in a seed drops that seed, which must be said, not hidden)."""
    out = []
    registered = getattr(cfg, "primary_list", [])
    # a primary pair not also in `compare` is compared only where it is registered
    only = [p for p in registered if [p["a"], p["b"]] not in [list(x) for x in cfg.compare]]
    for task in cfg.tasks:
        for setting in cfg.settings:
            for budget in cfg.budgets:
                by = at_budget(rows, task, setting, budget)
                here = [
                    (p["a"], p["b"]) for p in only if (p["task"], p["setting"], p["budget"]) == (task, setting, budget)
                ]
                for a, b in [*cfg.compare, *here]:
                    c = _compare_pair(cfg, rows, task, setting, budget, by, a, b, registered)
                    if c is not None:
                        out.append(c)
    return out


def _compare_pair(
    cfg: BenchConfig, rows: list[dict], task: str, setting: str, budget, by: dict, a: str, b: str, registered: list
) -> Comparison | None:
    """One configured comparison of `comparisons` at one task, setting and budget (None: a side has no row
    there, or the two share no seed)."""
    if a not in by or b not in by:
        return None
    sa = {r["seed"]: r for r in by[a] if r["correct"] is not None}
    sb = {r["seed"]: r for r in by[b] if r["correct"] is not None}
    seeds = sorted(set(sa) & set(sb))
    if not seeds:
        return None
    dropped = _dropped_seeds(cfg, rows, task, setting, budget, seeds, ((a, sa), (b, sb)))
    for s in seeds:  # the same test examples, in the same order, or no comparison
        if sa[s]["ids"] != sb[s]["ids"]:
            raise ValueError(f"{a} and {b} (seed {s}) were evaluated on different test examples")
    # seeds are clusters: a t interval over the seeds' mean paired differences plus the examples' term
    c = compare_paired_seeds(a, [sa[s]["correct"] for s in seeds], b, [sb[s]["correct"] for s in seeds])
    # both sides' training/selection FLOPs (mean over the compared seeds): a comparison states what
    # each spent
    c.update(
        task=cfg.label(task),
        setting=setting,
        budget=budget,
        seeds=seeds,
        seeds_dropped=dropped,
        flops_a=statistics.fmean(sa[s]["flops"] or 0.0 for s in seeds),
        flops_b=statistics.fmean(sb[s]["flops"] or 0.0 for s in seeds),
    )
    if registered and len(seeds) > 1:  # the across-seed interval's own test, for Holm
        c["p"] = seed_example_interval(
            [[int(bool(x)) for x in sa[s]["correct"]] for s in seeds],
            [[int(bool(x)) for x in sb[s]["correct"]] for s in seeds],
        )["p"]
    return c


def _dropped_seeds(cfg: BenchConfig, rows: list[dict], task: str, setting: str, budget, seeds: list, sides) -> dict:
    """{planned seed left out of a comparison: why}; `sides` is ((a, a's rows by seed), (b, b's rows by seed))."""
    dropped = {}
    # the seeds both sides plan to run (a method with its own `seeds` plans fewer: the others are not dropped)
    planned = set.intersection(*(set(cfg.seeds_for(task, _cell_of(rows, task, n))) for n, _ in sides))
    for s in cfg.seeds_of(task):
        if s in seeds or s not in planned:
            continue
        why = {n: _seed_status(rows, task, setting, budget, n, s) for n, h in sides if s not in h}
        # a seed neither side has run in yet is just that; otherwise which side, and why
        dropped[s] = (
            "not run yet"
            if len(why) == 2 and set(why.values()) == {"not run yet"}
            else "; ".join(f"{n} {w}" for n, w in why.items())
        )
    return dropped


def write_csv(path: Path, rows: list[dict], columns: list[str] = CSV_COLUMNS) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(
            {k: ("" if r.get(k) is None else (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k])) for k in columns}
        )
    atomic_write_text(path, buf.getvalue())


def at_top_budget(tuning: list[dict], value) -> dict[tuple, float]:
    """{(task, label, trial): value(record) of that trial's largest-budget record}: each trial counted once
    (an iterative trial's smaller budgets are checkpoints of that run; a population trial's smaller
    budgets reuse its population and add their own evaluations)."""
    top: dict[tuple, tuple[float, float]] = {}  # (task, label, trial, seed) -> (its largest budget, value there)
    for rec in tuning:
        key = (rec["task"], rec["label"], rec.get("trial", 0), rec.get("seed"))  # a trial on several seeds: each run
        if rec.get("budget") is None or rec["budget"] >= top.get(key, (-1.0, 0.0))[0]:
            top[key] = (rec.get("budget") or 0.0, value(rec))
    return {key: v for key, (_, v) in top.items()}


def trial_flops(tuning: list[dict]) -> dict[str, float]:
    """Per searched method (cell label), the FLOPs its trials' top-budget cells used, summed over trials and
    tasks: a well-defined size of the tuning (`at_top_budget`)."""
    out: dict[str, float] = {}
    for (_, label, *_), flops in at_top_budget(tuning, lambda r: r.get("flops") or 0.0).items():
        out[label] = out.get(label, 0.0) + flops
    return out


def cell_seconds(rec: dict) -> float:
    """A cell's measured time toward its output: its own wall (an iterative cell's is cumulative over its
    run, so the top budget includes the lower ones) plus, for a population method, the time it took to
    score the population prefix it used (scored once per seed and read by several cells)."""
    return float(rec.get("wall_seconds") or 0.0) + float(rec.get("population_seconds") or 0.0)


def tuning_rows(records: list[dict]) -> list[dict]:
    """One row per hyperparameter trial: its options and validation accuracy per reported row."""
    out = []
    for rec in sorted(records, key=lambda r: (r["task"], r["label"], r["budget"] or 0.0, r.get("trial", 0))):
        for row in flat_rows([rec]):
            row["trial"] = rec.get("trial")
            row["evaluation_flops"] = eval_flops(rec)
            row["validation_accuracy"] = row.pop("accuracy")
            out.append(row)
    return out


def unfit_seeds(rows: list[dict], task: str, setting: str, budget, name: str) -> list[int]:
    """The seeds in which row `name`'s cell does not fit `budget`."""
    cells = _cells_of(rows, task, name)
    return sorted(
        {
            r["seed"]
            for r in rows
            if r["task"] == task
            and r["setting"] == setting
            and r["budget"] == budget
            and r["cell"] in cells
            and r["accuracy"] is None
            and str(r["status"]).startswith("does not fit")
        }
    )


TUNING_COLUMNS = [
    "task",
    "task_label",
    "method",
    "budget",
    "trial",
    "validation_accuracy",
    "flops",
    "units",
    "status",
    "hyperparameters",
]


def ratio_comparisons(cfg: BenchConfig, rows: list[dict]) -> list[dict]:
    """`ratio_compare`: per task, setting and budget of row a (mean units N over its seeds), row b at the
    smallest budget whose mean units reach RATIO x N, compared on the seeds both have (the same test
    examples); where no budget of b reaches it, an entry saying how far b got."""
    out = []
    for entry in cfg.ratio_compare:
        a, b, ratio = entry["a"], entry["b"], float(entry.get("ratio", 10))
        for task in cfg.tasks:
            for setting in cfg.settings:
                for budget in cfg.budgets:
                    ra = {r["seed"]: r for r in at_budget(rows, task, setting, budget).get(a, []) if r["correct"]}
                    if not ra:
                        continue
                    n_a = statistics.fmean(float(r["units"] or 0) for r in ra.values())
                    found, most = _ratio_reach(cfg, rows, task, setting, b, ratio * n_a)
                    # a gate that kept the base makes a's row the base's: the table must say so
                    abstained = sum("abstained" in str(r.get("status", "")) for r in ra.values())
                    head = dict(
                        a=a,
                        b=b,
                        ratio=ratio,
                        task=cfg.label(task),
                        setting=setting,
                        budget=budget,
                        units_a=n_a,
                        abstained_a=abstained,
                        seeds_a=len(ra),
                    )
                    if found is None:
                        out.append({**head, "reached": False, "units_b": most})
                        continue
                    bb, rb, n_b = found
                    seeds = sorted(set(ra) & set(rb))
                    if not seeds:
                        continue
                    c = compare_paired_seeds(a, [ra[s]["correct"] for s in seeds], b, [rb[s]["correct"] for s in seeds])
                    c.update(
                        head,
                        reached=True,
                        budget_b=bb,
                        units_b=n_b,
                        seeds=seeds,
                        flops_a=statistics.fmean(ra[s]["flops"] or 0.0 for s in seeds),
                        flops_b=statistics.fmean(rb[s]["flops"] or 0.0 for s in seeds),
                    )
                    out.append(c)
    return out


def _ratio_reach(cfg: BenchConfig, rows: list[dict], task: str, setting: str, b: str, need: float):
    """Row b at the smallest budget whose mean units reach `need` ((budget, rows by seed, mean units), else
    None), and the most mean units any budget of b reached."""
    found = None
    most = 0.0
    for bb in cfg.budgets:
        rb = {r["seed"]: r for r in at_budget(rows, task, setting, bb).get(b, []) if r["correct"]}
        if not rb:
            continue
        n_b = statistics.fmean(float(r["units"] or 0) for r in rb.values())
        most = max(most, n_b)
        if n_b >= need:
            found = (bb, rb, n_b)
            break
    return found, most


def equivalence_tests(cfg: BenchConfig, rows: list[dict]) -> list[dict]:
    """`equivalence` entries: per task, setting and budget where both rows ran on the same >= 2 seeds,
    two one-sided tests (corp.algorithms.stats.tost_from) of |a - b| < margin on the across-seed interval's mean,
    standard error and df (the comparisons' own t: seeds plus the test examples' term)."""
    out = []
    for e in getattr(cfg, "equivalence_list", []):
        for task in [e["task"]] if e["task"] else cfg.tasks:
            for setting in [e["setting"]] if e["setting"] else cfg.settings:
                for budget in [e["budget"]] if e["budget"] is not None else cfg.budgets:
                    by = at_budget(rows, task, setting, budget)
                    sa = {r["seed"]: r for r in by.get(e["a"], []) if r["correct"] is not None}
                    sb = {r["seed"]: r for r in by.get(e["b"], []) if r["correct"] is not None}
                    seeds = sorted(set(sa) & set(sb))
                    head = {"a": e["a"], "b": e["b"], "margin": e["margin"], "task": cfg.label(task)}
                    head.update(setting=setting, budget=budget, seeds=seeds)
                    if len(seeds) < 2:
                        if e["task"] or seeds:  # a pair that ran nowhere here is left out unless named
                            out.append({**head, "test": None})
                        continue
                    iv = seed_example_interval(
                        [[int(bool(x)) for x in sa[s]["correct"]] for s in seeds],
                        [[int(bool(x)) for x in sb[s]["correct"]] for s in seeds],
                    )
                    out.append({**head, "test": tost_from(iv["mean"], iv["se"], iv["df"], e["margin"])})
    return out
