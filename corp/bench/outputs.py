"""The bench's outputs: results.csv, table.md, plots, and the README results section.

Statistics: per (task, setting, budget, row) the mean and sample standard deviation of test
accuracy across seeds; each configured comparison pairs the two rows' per-example outcomes on the
same test examples in every seed (`corp.stats.compare_paired_seeds`: the across-seed 95% interval,
a t interval over the seeds' mean paired differences with k - 1 df plus the test examples' sampling
term, and per seed the difference with its within-seed paired interval and the sign count). A
sentence that says one row beats another is written only when the across-seed interval excludes
zero; it cites the interval and both sides' FLOPs.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from corp.bench.accounting import eval_flops
from corp.bench.config import (
    BENCH_PROTOCOL,
    BenchConfig,
    _at_budget,
    _budget_text,
    _file,
    headline_setting,
    save_plot,
)
from corp.ledger import FLOPS_FORMULA, LORA_CONVENTION
from corp.runs import atomic_write_text, read_json, write_json
from corp.stats import compare_paired_seeds, examples_text, seed_example_interval, sign_text

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


def flat_rows(records: list[dict]) -> list[dict]:
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
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits
    from corp.evaluate.tasks.code import _CodeTask

    out = []
    for task in tasks:
        try:
            t = get_task(task, cfg.data)
            if isinstance(t, _CodeTask):
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


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def dropped_text(c: dict) -> str:
    """A comparison's left-out seeds, grouped by why: 'seeds 1, 2 not run yet; seed 3 corp-stage1 does not fit'."""
    by: dict[str, list] = {}
    for s, why in (c.get("seeds_dropped") or {}).items():
        by.setdefault(why, []).append(str(s))
    return "; ".join(f"seed{'s' if len(ss) > 1 else ''} {', '.join(ss)}: {why}" for why, ss in by.items())


def _cells_of(rows: list[dict], task: str, name: str) -> set[str]:
    """The cell labels behind row `name` (a RandOpt row's cell is 'randopt'); a row that only ever
    failed is named by its cell label, so the name itself then."""
    return {r["cell"] for r in rows if r["method"] == name and r["task"] == task} or {name}


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


def comparisons(cfg: BenchConfig, rows: list[dict]) -> list[dict]:
    """The configured comparisons, on the seeds where both rows exist; every planned seed left out is named,
    with why (a side that does not fit in a seed drops that seed, which must be said, not hidden)."""
    out = []
    registered = getattr(cfg, "primary_list", [])
    # a primary pair not also in `compare` is compared only where it is registered
    only = [p for p in registered if [p["a"], p["b"]] not in [list(x) for x in cfg.compare]]
    for task in cfg.tasks:
        for setting in cfg.settings:
            for budget in cfg.budgets:
                by = _at_budget(rows, task, setting, budget)
                here = [
                    (p["a"], p["b"]) for p in only if (p["task"], p["setting"], p["budget"]) == (task, setting, budget)
                ]
                for a, b in [*cfg.compare, *here]:
                    if a not in by or b not in by:
                        continue
                    sa = {r["seed"]: r for r in by[a] if r["correct"] is not None}
                    sb = {r["seed"]: r for r in by[b] if r["correct"] is not None}
                    seeds = sorted(set(sa) & set(sb))
                    if not seeds:
                        continue
                    dropped = {}
                    for s in cfg.seeds_of(task):
                        if s in seeds:
                            continue
                        why = {
                            n: _seed_status(rows, task, setting, budget, n, s)
                            for n, h in ((a, sa), (b, sb))
                            if s not in h
                        }
                        # a seed neither side has run in yet is just that; otherwise which side, and why
                        dropped[s] = (
                            "not run yet"
                            if len(why) == 2 and set(why.values()) == {"not run yet"}
                            else "; ".join(f"{n} {w}" for n, w in why.items())
                        )
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
                    out.append(c)
    return out


def write_csv(path: Path, rows: list[dict], columns: list[str] = CSV_COLUMNS) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(
            {k: ("" if r.get(k) is None else (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k])) for k in columns}
        )
    atomic_write_text(path, buf.getvalue())


def _at_top_budget(tuning: list[dict], value) -> dict[tuple, float]:
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
    tasks: a well-defined size of the tuning (`_at_top_budget`)."""
    out: dict[str, float] = {}
    for (_, label, *_), flops in _at_top_budget(tuning, lambda r: r.get("flops") or 0.0).items():
        out[label] = out.get(label, 0.0) + flops
    return out


def _cell_seconds(rec: dict) -> float:
    """A cell's measured time toward its output: its own wall (an iterative cell's is cumulative over its
    run, so the top budget includes the lower ones) plus, for a population method, the time it took to
    score the population prefix it used (scored once per seed and read by several cells)."""
    return float(rec.get("wall_seconds") or 0.0) + float(rec.get("population_seconds") or 0.0)


def time_table(cfg: BenchConfig, records: list[dict], tuning: list[dict]) -> list[str]:
    """Measured time per method: per task and cell label, the median over seeds of each final cell's
    time at each budget (`_cell_seconds`, its test evaluation included), and its trials' total (each
    trial once, at its top budget, as `trial_flops` counts them)."""
    setting = headline_setting(cfg)
    final: dict[tuple, list[float]] = {}
    for rec in records:
        if rec["setting"] == setting and rec.get("status") == "done":
            final.setdefault((rec["task"], rec["label"], rec["budget"]), []).append(_cell_seconds(rec))
    trials: dict[tuple, list[float]] = {}
    for (task, label, *_), sec in _at_top_budget(tuning, _cell_seconds).items():
        trials.setdefault((task, label), []).append(sec)
    if not final and not trials:
        return []
    budgets = [None, *cfg.budgets]
    lines = [
        f"## Measured time per method ({setting}; minutes, median over seeds)",
        "",
        "| task | method | "
        + " | ".join("fixed" if b is None else _budget_text(b) for b in budgets)
        + " | trials (total) |",
        "|---|---|" + "---:|" * (len(budgets) + 1),
    ]
    for task in cfg.tasks:
        labels = list(dict.fromkeys(k[1] for k in [*final, *trials] if k[0] == task))
        for label in labels:
            cells = []
            for b in budgets:
                got = final.get((task, label, b))
                cells.append(f"{statistics.median(got) / 60:.1f} ({len(got)})" if got else "")
            t = trials.get((task, label))
            cells.append(f"{sum(t) / 60:.1f} ({len(t)})" if t else "")
            lines.append(f"| {cfg.label(task)} | {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each cell's own wall time, its test evaluation included, plus for RandOpt and CoRP the time it took "
        "to score the population prefix they used (a population is scored once and read by every cell that "
        "uses its scales, RandOpt's and CoRP's of a seed, or several trials: each of them counts it, so "
        "summing rows overcounts); an iterative cell at the top budget includes its run up to the lower one. `(k)`: seeds, or trials. The bench's processes ran with one thread each, as many as "
        "the machine had cores, so these are one-thread times on a busy machine.",
        "",
    ]
    return lines


def protocol_sentence(cfg: BenchConfig, tuning_flops: dict[str, float] | None = None) -> str:
    if cfg.hyperparameters != "search":
        return (
            "Hyperparameters: defaults (each method's options as given in the config, the same for every seed and "
            "budget, chosen without the test split; recorded per row in results.csv)."
        )
    searched = [n for n, spec in cfg.methods.items() if (spec or {}).get("search")]
    settings = "both data settings" if len(cfg.settings) > 1 else f"the {cfg.settings[0]} setting"
    if (
        tuned_apart(cfg) or cfg.protocol_tables
    ):  # the third edition's protocol: its own sentence (the compute table counts the trials)
        seeds = ", ".join(str(x) for x in cfg.seeds[: cfg.tune_seeds])
        return (
            f"Hyperparameters: search. Each of {', '.join(searched)} got {cfg.trials} trials (grid points drawn by a "
            f"fixed seed), each run on seed{'s' if cfg.tune_seeds > 1 else ''} {seeds} with the {cfg.tune_setting} "
            f"setting's splits and scored on the {tune_split_text(cfg)}, never on test; a trial's score is its mean over "
            f"those seeds, and the best trial's options (results.csv) were used for every seed in {settings}. Every "
            "trial is in tuning.csv; what the trials spent, their evaluations and discarded tries included, is in the "
            "compute table, beside each method's final cells. Other methods ran with the options given."
        )
    spent = ""
    if tuning_flops:
        spent = (
            " The trials' FLOPs are not charged to the final cells (every searched method got the same number "
            "of trials, each within the same budgets; the base none); their top-budget cells used, over tasks, "
            + ", ".join(f"{k} {v:.2g}" for k, v in sorted(tuning_flops.items()))
            + " FLOPs."
        )
    return (
        f"Hyperparameters: search. Each of {', '.join(searched)} got {cfg.trials} trials (grid points drawn "
        f"by a fixed seed), run on seed {cfg.seeds[0]} with the paper setting's splits (each method its own: "
        f"RandOpt, ES and GRPO train on the {cfg.n_support} support examples there) and compared on the "
        f"{cfg.n_validation}-example validation split, never on test (CoRP's gate also accepts on validation, "
        "so its trial scores are optimistic; test is not affected); the best trial's options (results.csv) "
        f"were used for every seed in {settings}, so these methods also used the {cfg.n_validation} validation "
        "labels to choose them (the 'labelled' column says so: '+ val' where those labels are extra, 'tuned on "
        "val' where they are among the method's own). Every trial is in tuning.csv. Other methods "
        f"ran with the options given.{spent}"
    )


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


def tuned_apart(cfg: BenchConfig) -> bool:
    """Whether the trials ran under the third edition's tuning fields (not the second edition's defaults)."""
    return (cfg.tune_setting, cfg.tune_split, cfg.tune_seeds, cfg.tune_options) != ("paper", "validation", 1, {})


def tune_split_text(cfg: BenchConfig) -> str:
    """'64-example validation split', or 'dev split' (a size given in tune_options as n_dev is stated)."""
    n = cfg.n_validation if cfg.tune_split == "validation" else cfg.tune_options.get(f"n_{cfg.tune_split}")
    return f"{n}-example {cfg.tune_split} split" if n else f"{cfg.tune_split} split"


def _labelled_text(cfg: BenchConfig, row: dict) -> str:
    """A row's labelled examples, with the validation labels its options were chosen on (a searched method):
    '0 + 64 val' where they are labels the method does not otherwise see, '144 (tuned on val)' where the
    validation split is among its own (splits are consecutive slices of one shuffle: equal-data's support
    of 144 is support + probe + validation)."""
    n = row["labelled_examples"]
    if n is None:
        return ""
    if not row.get("tuned"):
        return str(n)
    if cfg.tune_split != "validation":  # a split of its own (dev): never among a method's labelled examples
        size = cfg.tune_options.get(f"n_{cfg.tune_split}")
        return f"{n} + {size or ''}{' ' if size else ''}{cfg.tune_split}"
    inside = n >= cfg.n_support + cfg.n_probe + cfg.n_validation
    return f"{n} (tuned on val)" if inside else f"{n} + {cfg.n_validation} val"


def table_md(
    cfg: BenchConfig,
    rows: list[dict],
    comps: list[dict],
    missing: list[dict],
    command: str,
    tuning_flops: dict[str, float] | None = None,
    reading: list[str] | None = None,
    times: list[str] | None = None,
    primary: list[dict] | None = None,
    extra: list[str] | None = None,
) -> str:
    """`primary`: the registered comparisons with Holm's correction (corp.bench.protocol.mark_primary), shown
    apart from the exploratory ones; `extra`: the third edition's sections (compute, regime, the papers' comparisons)."""
    lines = [
        f"# Bench `{cfg.name}`: {cfg.model}",
        "",
        f"Made by `{command}`. Test accuracy, mean ± sd over seeds {seeds_text(cfg)} ({cfg.n_test} "
        "test examples, the same for every method and seed); columns are training/selection FLOP budgets.",
        "",
        "Compute and data were matched like this: every cell uses at most its FLOP budget from the compute ledger, "
        "every FLOP spent toward its output counted, the hyperparameter trials apart (below) (population methods the largest prefix of one shared scored "
        "population per seed such that the prefix plus the method's own evaluations, CoRP's probe, step search and "
        "gates, fit; ES, GRPO and FGRPO their last checkpoint at or below it; a method that cannot fit is 'does not "
        "fit', never an overshoot; evaluations that only feed a report are not run), each cell reports the FLOPs it "
        "used, here and in results.csv, and every row states its labelled examples ("
        + "; ".join(
            {
                "paper": "paper: each method's own splits, CoRP support + probe + validation = "
                f"{cfg.n_support + cfg.n_probe + cfg.n_validation}, RandOpt/ES/GRPO support = {cfg.n_support}",
                "equal-data": "equal-data: every method that learns uses support + probe + validation = "
                f"{cfg.n_support + cfg.n_probe + cfg.n_validation}",
            }.get(s, s)
            for s in cfg.settings
        )
        + f"). {protocol_sentence(cfg, tuning_flops)} FLOPs: {FLOPS_FORMULA}. {LORA_CONVENTION}",
        "",
    ]
    lines += headline_table(cfg, rows)
    if reading:
        lines += ["## What it shows", "", *reading, "", PRIMARY_NOTE if primary is not None else MULTIPLE_NOTE, ""]
    for task in cfg.tasks:
        for setting in cfg.settings:
            names: list[str] = []
            for r in rows:
                if r["task"] == task and r["setting"] == setting and r["method"] not in names:
                    names.append(r["method"])
            if not names:
                continue
            lines += [
                f"## {cfg.label(task)}, {setting}",
                "",
                "| method | labelled | passes/ex | " + " | ".join(_budget_text(b) for b in cfg.budgets) + " |",
                "|---|---:|---:|" + "---:|" * len(cfg.budgets),
            ]
            for name in names:
                cells = []
                labelled = passes = ""
                for b in cfg.budgets:
                    got = _at_budget(rows, task, setting, b).get(name, [])
                    unfit = _unfit_seeds(rows, task, setting, b, name)
                    if not got:
                        cells.append("does not fit" if unfit else "—")
                        continue
                    labelled, passes = _labelled_text(cfg, got[0]), got[0]["passes_per_example"]
                    flops = statistics.fmean([g["flops"] for g in got])
                    note = "" if not flops else f" ({flops:.2g} F)"
                    flags = "*" if any("abstained" in g["status"] for g in got) else ""
                    cells.append(f"{_spread(cfg, got, len(unfit))}{flags}{note}")
                if labelled == "" and all(c == "—" for c in cells):
                    cells = [
                        next(
                            (
                                f"({r['status']})"
                                for r in rows
                                if r["method"] == name and r["task"] == task and r["setting"] == setting
                            ),
                            "—",
                        )
                    ] + cells[1:]
                lines.append(f"| {name} | {labelled} | {passes} | " + " | ".join(cells) + " |")
            lines.append("")
    lines.append(
        "`*`: CoRP abstained (its gate kept the base) in at least one seed. `(x F)`: mean FLOPs the cell actually used. "
        f"`{LABEL_PRIOR}`: a reference, not a method: the most common answer among the labelled examples, given to "
        "every test example (what learning only the label prior scores; results.csv says which answer)."
    )
    lines.append("")
    if primary is not None:
        lines += primary_table(primary)
        exploratory = [c for c in comps if not c.get("primary")]
        if exploratory:
            lines += comparisons_table(exploratory, "Exploratory comparisons (not pre-registered, not corrected)")
    elif comps:
        lines += comparisons_table(comps)
    unmatched = [f"{a} vs {b}" for a, b in cfg.compare if not any((c["a"], c["b"]) == (a, b) for c in comps)]
    if unmatched:  # a pair naming a row no cell reports (a typo, or a top_k clipped to one row) is said, not dropped
        names = sorted({r["method"] for r in rows})
        lines += [
            "Configured comparisons with no pair of rows to compare: "
            + "; ".join(unmatched)
            + f" (rows: {', '.join(names)}).",
            "",
        ]
    lines += extra or []
    lines += times or []
    if missing:
        lines += (
            ["## Missing methods (not run, with the reason)", ""]
            + [f"- {m['method']}: {m['reason']}" for m in missing]
            + [""]
        )
    return "\n".join(lines)


def _flops_text(c: dict) -> str:
    return f"{c['a']} {c.get('flops_a', 0.0):.2g} FLOPs, {c['b']} {c.get('flops_b', 0.0):.2g} FLOPs"


def _p_text(p) -> str:
    return "—" if p is None else f"{p:.3g}"


def primary_table(primary: list[dict]) -> list[str]:
    """The pre-registered comparisons, every one of them (a comparison not run yet says so): its
    difference and across-seed interval, the interval's p, Holm's adjusted p over the whole family and
    the decision at 0.05."""
    from corp.bench.protocol import HOLM_ALPHA

    lines = [
        f"## Primary comparisons (pre-registered; Holm over all {len(primary)})",
        "",
        "Registered before any final cell ran (preregistration.json beside cells/). p: the across-seed interval's "
        "two-sided t test (k - 1 df); Holm: the step-down adjusted p over every registered comparison, run or not; "
        f"a primary claim needs Holm p <= {HOLM_ALPHA:g}.",
        "",
        "| pair | task | setting | budget | difference | 95% interval | signs | p | Holm p | decision |",
        "|---|---|---|---:|---:|---|---|---:|---:|---|",
    ]
    for r in primary:
        e, c = r["entry"], r["comparison"]
        where = f"| {e['a']} vs {e['b']} | {e['task_label']} | {e['setting']} | {_budget_text(e['budget'])} |"
        if c is None:
            lines.append(f"{where} | | | | | | not run yet |")
            continue
        if c.get("n_seeds", 1) < 2:
            lines.append(f"{where} {c['difference']:+.3f} | | | | | one seed only, no claim |")
            continue
        decision = (
            "no difference shown"
            if not r["reject"]
            else (f"{e['a']} better" if c["difference"] > 0 else f"{e['b']} better")
        )
        lines.append(
            f"{where} {c['difference']:+.3f} | {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f} | {sign_text(c)} | "
            f"{_p_text(r['p'])} | {_p_text(r['p_holm'])} | {decision} |"
        )
    return lines + [""]


def primary_sentences(primary: list[dict]) -> list[str]:
    """One sentence per registered comparison; 'beats' only where Holm's adjusted p is <= 0.05."""
    out = []
    for r in primary:
        e, c = r["entry"], r["comparison"]
        where = f"on {e['task_label']} ({e['setting']}, budget {_budget_text(e['budget'])} FLOPs"
        if c is None:
            out.append(f"{e['a']} vs {e['b']} {where}): not run yet.")
            continue
        where += f"; {_flops_text(c)})"
        if c.get("n_seeds", 1) < 2:
            out.append(f"{e['a']} vs {e['b']} {where}: one seed only, no claim ({c['difference']:+.3f}).")
            continue
        stat = (
            f"95% CI {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}, p = {_p_text(r['p'])}, Holm p = "
            f"{_p_text(r['p_holm'])}, signs {sign_text(c)}, {examples_text(c)}"
        )
        if r["reject"] and c["difference"] > 0:
            out.append(f"{e['a']} beats {e['b']} {where} by {c['difference']:+.3f} ({stat}).")
        elif r["reject"]:
            out.append(f"{e['b']} beats {e['a']} {where} by {-c['difference']:+.3f} ({stat}).")
        else:
            out.append(f"{e['a']} vs {e['b']} {where}: no difference shown ({c['difference']:+.3f}, {stat}).")
    return out


def comparisons_table(comps: list[dict], heading: str = "Paired comparisons") -> list[str]:
    """The configured comparisons as one table: pair, where, difference, across-seed interval,
    per-seed differences with their within-seed intervals, sign count, each side's FLOPs."""
    lines = [
        f"## {heading}",
        "",
        (
            "Same test examples in every seed. Interval: 95%, a t interval over the seeds' mean paired differences (k "
            "- 1 df) plus the test examples' sampling term; per seed: the difference and its paired bootstrap "
            "interval; signs: seeds where the first row is above (+), below (-) or level with (=) the second. "
            "Seeds are those where both rows exist; a left-out seed is named with why. A comparison with one "
            f"seed so far makes no claim. {MULTIPLE_NOTE}"
        ),
        "",
        "| pair | task | setting | budget | difference | 95% interval | per seed | signs | FLOPs (a / b) |",
        "|---|---|---|---:|---:|---|---|---|---|",
    ]
    for c in comps:
        if c.get("n_seeds", 1) > 1:
            per = "; ".join(f"{p['difference']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]" for p in c["per_seed"])
            signs = sign_text(c)
        else:
            per, signs = f"one seed only, no claim (McNemar p = {c['mcnemar_p']:.3g})", "—"
        if c.get("seeds_dropped"):
            per += f"; left out: {dropped_text(c)}"
        lines.append(
            f"| {c['a']} vs {c['b']} | {c['task']} | {c['setting']} | {_budget_text(c['budget'])} | "
            f"{c['difference']:+.3f} | {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f} | {per} | {signs} | "
            f"{c.get('flops_a', 0.0):.2g} / {c.get('flops_b', 0.0):.2g} |"
        )
    lines.append("")
    return lines


def _unfit_seeds(rows: list[dict], task: str, setting: str, budget, name: str) -> list[int]:
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


def _spread(cfg: BenchConfig, got: list[dict], unfit: int = 0) -> str:
    """Mean ± sd over seeds; with fewer seeds than configured says how many, and how many of the others do
    not fit the budget (the rest are not run yet), never a bare ± 0."""
    m, sd = _mean_sd([g["accuracy"] for g in got])
    if got[0]["method"] == LABEL_PRIOR:  # the same in every seed by construction: no spread to state
        return f"{m:.3f} (reference)"
    planned = len(cfg.seeds_of(got[0]["task"]))  # the task's own seeds
    if len(got) == planned:
        return f"{m:.3f} ± {sd:.3f}"
    why = f"; {unfit} do{'es' if unfit == 1 else ''} not fit" if unfit else ""
    return f"{m:.3f} ({len(got)} of {planned} seeds{'' if len(got) == 1 else f', sd {sd:.3f}'}{why})"


def headline_table(cfg: BenchConfig, rows: list[dict]) -> list[str]:
    """One table: per task and method (cell label), its best single model at each budget, i.e. the
    row with one inference pass per example (RandOpt top-1, not its K-vote; self-consistency@1), in the
    headline data setting; with passes/example and labelled examples. Where a method has several
    single-pass rows the first in the config's order is shown (choosing by test accuracy would select on test)."""
    setting = headline_setting(cfg)
    lines = [
        f"## Headline: best single model per method ({setting}; test accuracy, mean ± sd over seeds)",
        "",
        "| task | method | labelled | passes/ex | " + " | ".join(_budget_text(b) for b in cfg.budgets) + " |",
        "|---|---|---:|---:|" + "---:|" * len(cfg.budgets),
    ]
    for task in cfg.tasks:
        # per cell label (a method variant), its single-pass row; a method that fitted no budget has
        # only "does not fit" rows (named by its cell label) and is listed with them, not left out
        chosen: dict[str, str] = {}
        for r in rows:
            if r["task"] != task or r["setting"] != setting:
                continue
            if r["accuracy"] is None and str(r["status"]).startswith("does not fit"):
                chosen.setdefault(r["cell"], "")
            elif (r["passes_per_example"] == 1 or r["method"] == LABEL_PRIOR) and r["accuracy"] is not None:
                key = "base" if r["method"] == "base" else r["cell"]  # the base is a row of its own
                if not chosen.get(key):
                    chosen[key] = r["method"]
        for cell_label, name in chosen.items():
            cells, labelled = [], ""
            passes = "" if not name else (0 if name == LABEL_PRIOR else 1)
            for b in cfg.budgets:
                got = _at_budget(rows, task, setting, b).get(name, []) if name else []
                if not got:
                    cells.append("does not fit" if _unfit_seeds(rows, task, setting, b, cell_label) else "—")
                    continue
                labelled = _labelled_text(cfg, got[0])
                unfit = _unfit_seeds(rows, task, setting, b, name)
                cells.append(f"{_spread(cfg, got, len(unfit))} ({statistics.fmean(g['flops'] for g in got):.2g} F)")
            lines.append(
                f"| {cfg.label(task)} | {name or cell_label} | {labelled} | {passes} | " + " | ".join(cells) + " |"
            )
    return lines + [""]


def seeds_text(cfg: BenchConfig) -> str:
    """The seeds, with the tasks that run a subset of them (a task entry's `seeds`)."""
    own = [f"{cfg.label(t)}: {', '.join(map(str, cfg.seeds_of(t)))}" for t in cfg.tasks if cfg.seeds_of(t) != cfg.seeds]
    return ", ".join(map(str, cfg.seeds)) + (f" ({'; '.join(own)})" if own else "")


def regime_text(cfg: BenchConfig) -> str:
    """What regime the bench ran in, in plain words (the README section states it)."""
    return (
        f"Regime: {cfg.model}; tasks {', '.join(cfg.label(t) for t in cfg.tasks)}; seeds "
        f"{seeds_text(cfg)}; budgets {', '.join(_budget_text(b) for b in cfg.budgets)} FLOPs; shared "
        f"population {cfg.population} specialists (sigmas {', '.join(f'{x:g}' for x in cfg.sigmas)}); splits support "
        f"{cfg.n_support}, probe {cfg.n_probe}, validation {cfg.n_validation}, test {cfg.n_test}; data settings "
        f"{', '.join(cfg.settings)} (headline: {headline_setting(cfg)}); hyperparameters: {cfg.hyperparameters}"
        + (
            (
                f" ({cfg.trials} trials per searched method, on {cfg.tune_split}"
                + (f", {cfg.tune_seeds} seeds, {cfg.tune_setting} setting" if tuned_apart(cfg) else "")
                + ")"
            )
            if cfg.hyperparameters == "search"
            else ""
        )
        + "."
    )


PRIMARY_NOTE = (
    "The primary comparisons were registered before any final cell ran and are corrected together (Holm); "
    "every other interval is 95% on its own, with no adjustment for the number of comparisons: among many "
    "comparisons of equal rows about 1 in 20 would exclude 0 by chance."
)
MULTIPLE_NOTE = (
    "Each interval is 95% on its own, with no adjustment for the number of comparisons: among many "
    "comparisons of equal rows about 1 in 20 would exclude 0 by chance."
)


def beats_sentences(comps: list[dict]) -> list[str]:
    """One sentence per comparison; "beats" only where the across-seed interval (2 or more seeds) excludes 0."""
    out = []
    for c in comps:
        lo, hi = c["ci95"]
        where = f"on {c['task']} ({c['setting']}, budget {_budget_text(c['budget'])} FLOPs; {_flops_text(c)})"
        seeds = f"signs {sign_text(c)}, " if c.get("n_seeds", 1) > 1 else ""
        seeds += examples_text(c)
        if c.get("seeds_dropped"):
            seeds += f"; left out: {dropped_text(c)}"
        if c.get("n_seeds", 1) < 2:  # a within-seed interval says nothing about another seed: no claim
            out.append(
                f"{c['a']} vs {c['b']} {where}: one seed only, no claim ({c['difference']:+.3f}, "
                f"within-seed 95% CI {lo:+.3f} to {hi:+.3f}, {seeds})."
            )
        elif lo > 0:
            out.append(
                f"{c['a']} beats {c['b']} {where} by {c['difference']:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}, {seeds})."
            )
        elif hi < 0:
            out.append(
                f"{c['b']} beats {c['a']} {where} by {-c['difference']:+.3f} (95% CI "
                f"of {c['a']} - {c['b']}: {lo:+.3f} to {hi:+.3f}, {seeds})."
            )
        else:
            out.append(
                f"{c['a']} vs {c['b']} {where}: no difference shown ({c['difference']:+.3f}, "
                f"95% CI {lo:+.3f} to {hi:+.3f}, {seeds})."
            )
    return out


def _is_claim(c: dict) -> bool:
    lo, hi = c["ci95"]
    return c.get("n_seeds", 1) >= 2 and (lo > 0 or hi < 0)


def _pairs_text(comps: list[dict]) -> str:
    """'a vs b (arith 1.2e+13, 2.8e+13; letters 2.8e+13); c vs d (...)': comparisons grouped by pair."""
    by: dict[tuple[str, str], dict[str, list[str]]] = {}
    for c in comps:
        by.setdefault((c["a"], c["b"]), {}).setdefault(c["task_label"], []).append(_budget_text(c["budget"]))
    return "; ".join(
        f"{a} vs {b} (" + "; ".join(f"{t} " + ", ".join(bs) for t, bs in where.items()) + ")"
        for (a, b), where in by.items()
    )


def reading_lines(
    cfg: BenchConfig, rows: list[dict], comps: list[dict], primary: list[dict] | None = None
) -> list[str]:
    """What the headline shows, in plain words, from the rows and comparisons alone (nothing typed in by
    hand): per task, the highest single-model mean at the top budget beside the base and, where the
    majority-answer reference is at or above it, that the task's gains mostly measure its label prior;
    then the claims (only comparisons whose across-seed interval excludes 0, in full), and the
    comparisons that show no difference or have one seed only, grouped by pair. A highest mean is a
    description, not a claim: whether it beats the next row is said by the claims alone."""
    setting = headline_setting(cfg)
    top = cfg.budgets[-1]
    out = []
    for task in cfg.tasks:
        by = _at_budget(rows, task, setting, top)
        single = {
            n: got for n, got in by.items() if n not in ("base", LABEL_PRIOR) and got[0]["passes_per_example"] == 1
        }
        if not single:
            continue
        means = {n: statistics.fmean(r["accuracy"] for r in got) for n, got in single.items()}
        best = max(means, key=lambda n: means[n])
        k = len({r["seed"] for r in single[best]})
        text = (
            f"On {cfg.label(task)} at {_budget_text(top)} FLOPs ({setting}), the highest mean test accuracy of a "
            f"single model is {best}'s {means[best]:.3f} over {k} seed{'s' if k != 1 else ''}"
        )
        if by.get("base"):
            text += f" (base {statistics.fmean(r['accuracy'] for r in by['base']):.3f})"
        prior = by.get(LABEL_PRIOR)
        if prior and prior[0]["accuracy"] >= means[best]:
            text += (
                f". The majority answer {prior[0].get('answer', '')!r} given to every example, with no model, scores "
                f"{prior[0]['accuracy']:.3f}, at or above every single model: gains on {cfg.label(task)} mostly measure how "
                "often a model gives that answer, not the task itself"
            )
        out += [text + ".", ""]
    if primary is not None:  # the registered family is the only source of claims; the rest are exploratory
        out += [f"Primary comparisons (pre-registered, Holm over all {len(primary)}; a claim needs Holm p <= 0.05):"]
        out += [f"- {s}" for s in primary_sentences(primary)] + [""]
        comps = [c for c in comps if not c.get("primary")]
    labelled = [dict(c, task_label=cfg.label(c["task"])) for c in comps]
    claims = [s for s, c in zip(beats_sentences(comps), comps) if _is_claim(c)]
    if claims and primary is not None:
        out += ["Exploratory (not pre-registered or corrected: the 95% interval excludes 0; a lead, not a claim):"]
        out += [f"- {s}" for s in claims] + [""]
    elif claims:
        out += ["Claims (the 95% across-seed interval excludes 0; FLOPs of both sides given):"]
        out += [f"- {s}" for s in claims] + [""]
    elif comps:
        out += ["No comparison's across-seed interval excludes 0, so no claim is made.", ""]
    level = [c for c in labelled if c.get("n_seeds", 1) >= 2 and not _is_claim(c)]
    if level:
        out += [
            f"No difference shown (the interval includes 0 at {_seeds_range(level)} seeds): {_pairs_text(level)}.",
            "",
        ]
    one = [c for c in labelled if c.get("n_seeds", 1) < 2]
    if one:
        out += [f"One seed only, no claim: {_pairs_text(one)}.", ""]
    return out[:-1] if out else out  # markdown paragraphs: one blank line between, none at the end


def _seeds_range(comps: list[dict]) -> str:
    ks = sorted({c.get("n_seeds", 1) for c in comps})
    return str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}"


def plots(cfg: BenchConfig, rows: list[dict], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for task in cfg.tasks:
        for setting in cfg.settings:
            sub = [r for r in rows if r["task"] == task and r["setting"] == setting and r["accuracy"] is not None]
            if not sub:
                continue
            fig, ax = plt.subplots(figsize=(7, 4.5))
            names = list(dict.fromkeys(r["method"] for r in sub))
            for name in names:
                mine = [r for r in sub if r["method"] == name]
                if all(r["budget"] is None for r in mine):  # no training compute: a horizontal reference line
                    m, sd = _mean_sd([r["accuracy"] for r in mine])
                    if name == LABEL_PRIOR:
                        ax.axhline(m, ls=":", lw=1, color="black", label=f"{name} (label prior, no model)")
                    elif name == "base" or mine[0]["passes_per_example"] == 1:
                        ax.axhline(
                            m, ls="--", lw=1, color="grey" if name == "base" else None, label=f"{name} (no training)"
                        )
                    continue
                xs, ys, es = [], [], []
                for b in cfg.budgets:
                    got = [r for r in mine if r["budget"] == b]
                    if got:
                        xs.append(statistics.fmean([g["flops"] for g in got]))
                        m, sd = _mean_sd([g["accuracy"] for g in got])
                        ys.append(m)
                        es.append(sd)
                if xs:
                    ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)
            ax.set_xscale("log")
            ax.set_xlabel("training / selection FLOPs actually used (mean over seeds)")
            ax.set_ylabel("test accuracy (mean ± sd over seeds)")
            ax.set_title(f"{cfg.name}: {cfg.label(task)}, {setting}")
            ax.legend(fontsize=7, loc="best")
            made.append(save_plot(fig, out, f"accuracy_vs_flops__{_file(cfg.label(task))}__{setting}.png"))

            # inference passes per example: RandOpt K-vote and self-consistency@K (largest budget), CoRP at 1
            top = cfg.budgets[-1]
            by = _at_budget(rows, task, setting, top)
            fig, ax = plt.subplots(figsize=(6, 4))
            for family, test in (
                ("RandOpt K-vote", lambda n: n.startswith("randopt")),
                ("self-consistency@K", lambda n: n.startswith("self-consistency")),
                ("CoRP", lambda n: n.startswith("corp") and "/" not in n),  # not RandOpt on CoRP's population
            ):
                pts = {}
                for n, got in by.items():
                    if test(n):
                        pts.setdefault(got[0]["passes_per_example"], []).append(
                            (n, _mean_sd([g["accuracy"] for g in got]))
                        )
                if not pts:
                    continue
                if family == "CoRP":
                    for n, (m, sd) in pts.get(1, []):
                        ax.errorbar([1], [m], yerr=[sd], marker="*", ms=10, capsize=3, ls="none", label=n)
                    continue
                ks = sorted(pts)
                ax.errorbar(
                    ks,
                    [pts[k][0][1][0] for k in ks],
                    yerr=[pts[k][0][1][1] for k in ks],
                    marker="o",
                    capsize=3,
                    label=family,
                )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("inference passes per test example")
            ax.set_ylabel("test accuracy (mean ± sd over seeds)")
            ax.set_title(f"{cfg.label(task)}, {setting}, budget {_budget_text(top)} FLOPs")
            ax.legend(fontsize=7, loc="best")
            made.append(save_plot(fig, out, f"accuracy_vs_passes__{_file(cfg.label(task))}__{setting}.png"))
    return made


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


def write_outputs(
    cfg: BenchConfig,
    records: list[dict],
    missing: list[dict],
    command: str,
    not_run: int = 0,
    tuning: list[dict] | None = None,
    older: int = 0,
) -> dict:
    """`older`: cell records of an older bench protocol in the cells directory (kept, not reported; the tables say so)."""

    out = Path(cfg.results_dir) / cfg.name
    rows = flat_rows(records)
    rows += label_prior_rows(cfg, [t for t in cfg.tasks if any(r["task"] == t for r in rows)])
    for r in rows:
        r["task_label"] = cfg.label(r["task"])
    write_csv(out / "results.csv", rows)
    if tuning:
        trials = tuning_rows(tuning)
        for r in trials:
            r["task_label"] = cfg.label(r["task"])
        # the third edition's trials: which seed, and what evaluating them on the tuning split cost (search)
        more = ["seed", "evaluation_flops"] if cfg.protocol_tables or cfg.tune_seeds > 1 else []
        write_csv(out / "tuning.csv", trials, TUNING_COLUMNS + more)
    comps = comparisons(cfg, rows)
    primary = None
    if getattr(cfg, "primary_list", None):
        from corp.bench.protocol import mark_primary

        primary = mark_primary(cfg, comps)
        for r in primary:
            r["entry"] = {**r["entry"], "task_label": cfg.label(r["entry"]["task"])}
    reading = reading_lines(cfg, rows, comps, primary)
    times = time_table(cfg, records, tuning or [])
    extra = protocol_sections(cfg, rows, records, tuning or [])
    retained = None
    if cfg.retention:  # absent from an older config's outputs
        from corp.bench import retention

        retained = retention.summarise(cfg, rows, retention.load_records(cfg, records))
        extra += retention.section(cfg, retained)
    equivalences = equivalence_tests(cfg, rows)
    if getattr(cfg, "equivalence_list", None):
        extra += equivalence_section(equivalences)
    text = table_md(
        cfg, rows, comps, missing, command, trial_flops(tuning or []), reading, times, primary=primary, extra=extra
    )
    if not_run:
        head, _, rest = text.partition("\n\n")
        text = (
            f"{head}\n\n**Incomplete: {not_run} of {not_run + len(records)} "
            f"final (non-trial) cells not run yet** (rerun the command to continue).\n\n{rest}"
        )
    if older:
        head, _, rest = text.partition("\n\n")
        text = (
            f"{head}\n\n{older} cell record(s) of an older bench protocol are kept in cells/ and not used here "
            f"(their rows were made under other budget rules).\n\n{rest}"
        )
    atomic_write_text(out / "table.md", text)
    made = plots(cfg, rows, out)
    if retained is not None:
        from corp.bench import retention

        made += retention.plot(cfg, retained, out)
    write_json(
        out / "bench.json",
        {
            "name": cfg.name,
            "command": command,
            "cells_not_run": not_run,
            "model": cfg.model,
            "tasks": cfg.tasks,
            "seeds": cfg.seeds,
            "task_seeds": {cfg.label(t): cfg.seeds_of(t) for t in cfg.tasks},
            "budgets": cfg.budgets,
            "settings": cfg.settings,
            "missing": missing,
            "plots": made,
            "comparisons": comps,
            "beats": beats_sentences(comps),
            "reading": reading,
            "bench_protocol": BENCH_PROTOCOL,
            "older_protocol_records": older,
            **({"retention": retained} if retained is not None else {}),
            **({"equivalence": equivalences} if getattr(cfg, "equivalence_list", None) else {}),
            # the third edition's (absent from an older bench's bench.json)
            **(
                {
                    "primary": [
                        {k: r[k] for k in ("entry", "p", "p_holm", "reject")} | {"run": r["comparison"] is not None}
                        for r in primary
                    ],
                    "preregistration": str(out / "preregistration.json"),
                }
                if primary is not None
                else {}
            ),
        },
    )
    return {
        "results_dir": str(out),
        "rows": len(rows),
        "plots": made,
        "comparisons": len(comps),
        "missing": [m["method"] for m in missing],
    }


def _section(text: str, heading: str) -> list[str]:
    """The lines of table.md's `## {heading}...` section (its heading line included), else []."""
    for part in ("\n" + text).split("\n## ")[1:]:
        if part.startswith(heading):
            return ("## " + part).rstrip().splitlines()
    return []


def readme_section(cfg: BenchConfig) -> str:
    """The README's results section, from the latest outputs of this bench (nothing recomputed):
    the regime, the headline table, what it shows in plain words (`reading_lines`: the claims in full,
    a "beats" only where the across-seed interval excludes 0, the other comparisons grouped by pair),
    one plot, and a link to table.md for everything else (each comparison's per-seed differences)."""
    from corp import CorpError

    out = Path(cfg.results_dir) / cfg.name
    if not (out / "bench.json").exists() or not (out / "table.md").exists():
        raise CorpError(f"no finished bench in '{out}'; run `corp bench --config ...` first")
    meta = read_json(out / "bench.json")
    table = (out / "table.md").read_text()
    headline = _section(table, "Headline")
    missing = _section(table, "Missing methods")
    incomplete = [line for line in table.splitlines() if line.startswith("**Incomplete")]
    lines = [
        f"## Results: `corp bench` ({cfg.name})",
        "",
        f"Generated by `corp bench --config ... --readme-section` from `{out}` (command: `{meta['command']}`).",
        "",
        regime_text(cfg),
        "",
        *incomplete,
        *([""] if incomplete else []),
    ]
    if headline:
        lines += ["#" + headline[0], *headline[1:], ""]
    if meta.get("reading"):
        lines += [
            "What it shows (95% intervals across seeds: a t interval with k - 1 df over the seeds' paired "
            "differences plus the test examples' term, paired on the same examples; a comparison with one "
            f"seed so far makes no claim). {PRIMARY_NOTE if meta.get('primary') is not None else MULTIPLE_NOTE}",
            "",
            *meta["reading"],
            "",
        ]
    plots = meta.get("plots", [])
    if plots:
        lines += [f"![{plots[0]}]({out / plots[0]})", ""]
    if missing:
        lines += ["Not run: " + "; ".join(m[2:] for m in missing[1:] if m.startswith("- ")) + ".", ""]
    lines.append(
        f"Every table (per task and setting), the comparisons with their per-seed differences and signs, "
        f"the protocol and {len(plots)} plot(s): [{out / 'table.md'}]({out / 'table.md'}); "
        f"every row in `{out / 'results.csv'}`"
        + (f", every trial in `{out / 'tuning.csv'}`." if (out / "tuning.csv").exists() else ".")
    )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the third edition's sections


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
                    ra = {r["seed"]: r for r in _at_budget(rows, task, setting, budget).get(a, []) if r["correct"]}
                    if not ra:
                        continue
                    n_a = statistics.fmean(float(r["units"] or 0) for r in ra.values())
                    found = None
                    most = 0.0
                    for bb in cfg.budgets:
                        rb = {r["seed"]: r for r in _at_budget(rows, task, setting, bb).get(b, []) if r["correct"]}
                        if not rb:
                            continue
                        n_b = statistics.fmean(float(r["units"] or 0) for r in rb.values())
                        most = max(most, n_b)
                        if n_b >= ratio * n_a:
                            found = (bb, rb, n_b)
                            break
                    head = dict(
                        a=a, b=b, ratio=ratio, task=cfg.label(task), setting=setting, budget=budget, units_a=n_a
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


def papers_section(cfg: BenchConfig, rows: list[dict]) -> list[str]:
    """The CoRP paper's comparisons: per task, setting and budget, each CoRP row beside RandOpt top-1
    and vote@K on its own population (population_rows) and the share of the vote's gain over top-1
    CoRP recovers; then `ratio_compare` (CoRP at N against RandOpt at RATIO x N)."""
    lines = []
    if cfg.population_rows:
        table = []
        for task in cfg.tasks:
            for setting in cfg.settings:
                for budget in cfg.budgets:
                    by = _at_budget(rows, task, setting, budget)
                    for name in [n for n in by if f"{n}/randopt-top1" in by]:
                        mean = {k: statistics.fmean(r["accuracy"] for r in v) for k, v in by.items()}
                        votes = sorted(
                            (n for n in by if n.startswith(f"{name}/randopt-vote@")), key=lambda n: int(n.split("@")[1])
                        )
                        top1 = mean[f"{name}/randopt-top1"]
                        vote = votes[-1] if votes else None
                        share = ""
                        if vote and mean[vote] != top1:
                            share = f"{(mean[name] - top1) / (mean[vote] - top1):+.2f}"
                        flops = statistics.fmean(r["flops"] for r in by[name])
                        pop = statistics.fmean(r["flops"] for r in by[f"{name}/randopt-top1"])
                        table.append(
                            f"| {cfg.label(task)} | {setting} | {_budget_text(budget)} | {name} {mean[name]:.3f} | "
                            f"{top1:.3f} | {'' if vote is None else f'{vote.split(chr(47))[1]} {mean[vote]:.3f}'} | {share} | "
                            f"{flops:.2g} / {pop:.2g} |"
                        )
        if table:
            lines += [
                "## The CoRP paper's comparisons: RandOpt on CoRP's own population",
                "",
                "| task | setting | budget | CoRP | RandOpt top-1 (same population) | RandOpt vote@K (same population) "
                "| share of the vote's gain CoRP recovers | FLOPs: CoRP / the population it read |",
                "|---|---|---:|---|---:|---|---:|---|",
                *table,
                "",
                "RandOpt's rows here rank CoRP's own population prefix on support (CoRP's report computes them), so "
                "they spent the population's FLOPs and none of CoRP's own evaluations; share: (CoRP - top-1) / "
                "(vote@K - top-1), means over seeds (the CoRP paper's claim is above 0.5). Paired intervals: name the "
                "rows (LABEL/randopt-top1) in compare or primary.",
                "",
            ]
    ratios = ratio_comparisons(cfg, rows)
    if ratios:
        lines += [
            "## At N against RATIO x N specialists",
            "",
            "| a (budget, units) | b (budget, units) | task | setting | difference | 95% interval | signs | FLOPs (a / b) |",
            "|---|---|---|---|---:|---|---|---|",
        ]
        for c in ratios:
            left = f"{c['a']} ({_budget_text(c['budget'])}, {c['units_a']:.3g})"
            if not c["reached"]:
                lines.append(
                    f"| {left} | {c['b']}: no budget reaches {c['ratio']:g} x {c['units_a']:.3g} (at most {c['units_b']:.3g}) "
                    f"| {c['task']} | {c['setting']} | | | | |"
                )
                continue
            iv = f"{c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}"
            signs = sign_text(c) if c.get("n_seeds", 1) > 1 else "one seed only, no claim"
            lines.append(
                f"| {left} | {c['b']} ({_budget_text(c['budget_b'])}, {c['units_b']:.3g}) | {c['task']} | {c['setting']} | "
                f"{c['difference']:+.3f} | {iv} | {signs} | {c['flops_a']:.2g} / {c['flops_b']:.2g} |"
            )
        lines += [
            "",
            "Units: mean over seeds (specialists for population methods); b at the smallest budget reaching the ratio.",
            "",
        ]
    return lines


def protocol_sections(cfg: BenchConfig, rows: list[dict], records: list[dict], tuning: list[dict]) -> list[str]:
    """The third edition's sections (each absent from an older config's table.md)."""
    from corp.bench.accounting import compute_table, regime_table

    lines = papers_section(cfg, rows)
    if cfg.protocol_tables:
        setting = headline_setting(cfg)
        lines += compute_table(cfg, records, tuning, setting) + regime_table(cfg, records, setting)
    return lines


# ----------------------------------------------------------------------------- equivalence (two one-sided tests)


def equivalence_tests(cfg: BenchConfig, rows: list[dict]) -> list[dict]:
    """`equivalence` entries: per task, setting and budget where both rows ran on the same >= 2 seeds,
    two one-sided tests (corp.stats.tost_from) of |a - b| < margin on the across-seed interval's mean,
    standard error and df (the comparisons' own t: seeds plus the test examples' term)."""
    from corp.stats import seed_example_interval, tost_from

    out = []
    for e in getattr(cfg, "equivalence_list", []):
        for task in [e["task"]] if e["task"] else cfg.tasks:
            for setting in [e["setting"]] if e["setting"] else cfg.settings:
                for budget in [e["budget"]] if e["budget"] is not None else cfg.budgets:
                    by = _at_budget(rows, task, setting, budget)
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


def equivalence_section(tests: list[dict]) -> list[str]:
    lines = [
        "## Equivalence (two one-sided tests, margins declared in the config)",
        "",
        "H0: the accuracy difference a - b is at least the margin in either direction; both one-sided t tests "
        "(the across-seed interval's t: k - 1 df, seeds plus the test examples' term) must reject at 0.05, i.e. "
        "the 90% interval lies inside (-margin, +margin). 'Not shown' is no evidence of a difference: the "
        "interval is wider than the margin allows.",
        "",
        "| pair | task | setting | budget | margin | difference | 90% interval | p (TOST) | decision |",
        "|---|---|---|---:|---:|---:|---|---:|---|",
    ]
    for t in tests:
        where = (
            f"| {t['a']} vs {t['b']} | {t['task']} | {t['setting']} | {_budget_text(t['budget'])} | ±{t['margin']:g} |"
        )
        x = t["test"]
        if x is None:
            lines.append(f"{where} | | | fewer than 2 seeds with both rows |")
            continue
        decision = f"equivalent within ±{t['margin']:g}" if x["equivalent"] else "equivalence not shown"
        lines.append(f"{where} {x['mean']:+.3f} | {x['ci'][0]:+.3f} to {x['ci'][1]:+.3f} | {x['p']:.3g} | {decision} |")
    return lines + [""]
