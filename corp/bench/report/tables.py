"""The markdown tables of table.md: the headline, the pre-registered comparisons, the paired
comparisons, measured time, the CoRP paper's comparisons and the equivalence tests."""

from __future__ import annotations

import statistics

from corp.algorithms.stats import sign_text
from corp.bench.accounting import compute_table, regime_table
from corp.bench.config import (
    BenchConfig,
    at_budget,
    budget_text,
    headline_setting,
)
from corp.bench.protocol import HOLM_ALPHA
from corp.bench.report.prose import (
    MULTIPLE_NOTE,
    PRIMARY_NOTE,
    dropped_text,
    labelled_text,
    p_text,
    protocol_sentence,
    seeds_text,
    spread_text,
)
from corp.bench.report.rows import LABEL_PRIOR, at_top_budget, cell_seconds, ratio_comparisons, unfit_seeds
from corp.runtime.ledger import FLOPS_FORMULA, LORA_CONVENTION


def time_table(cfg: BenchConfig, records: list[dict], tuning: list[dict]) -> list[str]:
    """Measured time per method: per task and cell label, the median over seeds of each final cell's
    time at each budget (`cell_seconds`, its test evaluation included), and its trials' total (each
    trial once, at its top budget, as `trial_flops` counts them)."""
    setting = headline_setting(cfg)
    final: dict[tuple, list[float]] = {}
    for rec in records:
        if rec["setting"] == setting and rec.get("status") == "done":
            final.setdefault((rec["task"], rec["label"], rec["budget"]), []).append(cell_seconds(rec))
    trials: dict[tuple, list[float]] = {}
    for (task, label, *_), sec in at_top_budget(tuning, cell_seconds).items():
        trials.setdefault((task, label), []).append(sec)
    if not final and not trials:
        return []
    budgets = [None, *cfg.budgets]
    lines = [
        f"## Measured time per method ({setting}; minutes, median over seeds)",
        "",
        "| task | method | "
        + " | ".join("fixed" if b is None else budget_text(b) for b in budgets)
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


def _budget_table(cfg: BenchConfig, rows: list[dict], task: str, setting: str) -> list[str]:
    """One task and setting: a row per method, a column per budget (mean ± sd over seeds, FLOPs used)."""
    lines: list[str] = []
    names: list[str] = []
    for r in rows:
        if r["task"] == task and r["setting"] == setting and r["method"] not in names:
            names.append(r["method"])
    if not names:
        return []
    lines += [
        f"## {cfg.label(task)}, {setting}",
        "",
        "| method | labelled | passes/ex | " + " | ".join(budget_text(b) for b in cfg.budgets) + " |",
        "|---|---:|---:|" + "---:|" * len(cfg.budgets),
    ]
    for name in names:
        cells = []
        labelled = passes = ""
        for b in cfg.budgets:
            got = at_budget(rows, task, setting, b).get(name, [])
            unfit = unfit_seeds(rows, task, setting, b, name)
            if not got:
                cells.append("does not fit" if unfit else "—")
                continue
            labelled, passes = labelled_text(cfg, got[0]), got[0]["passes_per_example"]
            flops = statistics.fmean([g["flops"] for g in got])
            note = "" if not flops else f" ({flops:.2g} F)"
            flags = "*" if any("abstained" in g["status"] for g in got) else ""
            cells.append(f"{spread_text(cfg, got, len(unfit))}{flags}{note}")
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
    return lines


def _comparison_sections(cfg: BenchConfig, rows: list[dict], comps: list[dict], primary) -> list[str]:
    """The primary comparisons (Holm-corrected) apart from the exploratory ones, or all of them; and
    the configured pairs no two rows could answer."""
    lines: list[str] = []
    if primary is not None:
        lines += primary_table(primary, cfg.row_share)
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
    return lines


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
            lines += _budget_table(cfg, rows, task, setting)
    lines.append(
        "`*`: CoRP abstained (its gate kept the base) in at least one seed. `(x F)`: mean FLOPs the cell actually used. "
        f"`{LABEL_PRIOR}`: a reference, not a method: the most common answer among the labelled examples, given to "
        "every test example (what learning only the label prior scores; results.csv says which answer)."
    )
    lines.append("")
    lines += _comparison_sections(cfg, rows, comps, primary)
    lines += extra or []
    lines += times or []
    if missing:
        lines += (
            ["## Missing methods (not run, with the reason)", ""]
            + [f"- {m['method']}: {m['reason']}" for m in missing]
            + [""]
        )
    return "\n".join(lines)


def primary_table(primary: list[dict], share=lambda row: 1.0) -> list[str]:
    """The pre-registered comparisons, every one of them (a comparison not run yet says so): its
    difference and across-seed interval, the interval's p, Holm's adjusted p over the whole family and
    the decision at 0.05. `share(row)`: the share of the budget a row's method may spend (`budget_share`: its
    tuning charged to it), against which a side that spent less is listed."""

    lines = [
        f"## Primary comparisons (pre-registered; Holm over all {len(primary)})",
        "",
        "Registered before any final cell ran (preregistration.json beside cells/). p: the across-seed interval's "
        "two-sided t test (k - 1 df); Holm: the step-down adjusted p over every registered comparison, run or not; "
        f"a primary claim needs Holm p <= {HOLM_ALPHA:g}.",
        "",
        "| pair | task | setting | budget | difference | 95% interval | signs | p | Holm p | decision | "
        "FLOPs used, a / b (share of the budget) |",
        "|---|---|---|---:|---:|---|---|---:|---:|---|---|",
    ]
    short, charged = [], []
    for r in primary:
        e, c = r["entry"], r["comparison"]
        where = f"| {e['a']} vs {e['b']} | {e['task_label']} | {e['setting']} | {budget_text(e['budget'])} |"
        if c is None:
            lines.append(f"{where} | | | | | not run yet | |")
            continue
        spent = _spent_text(c, e["budget"])
        sides = ((e["a"], c["flops_a"]), (e["b"], c["flops_b"]))
        short += [n for n, f in sides if 0 < f < SPENT_IN_FULL * e["budget"] * share(n)]
        charged += [f"{n} ({share(n):g} of it)" for n, _ in sides if share(n) != 1.0]
        if c.get("n_seeds", 1) < 2:
            lines.append(f"{where} {c['difference']:+.3f} | | | | | one seed only, no claim | {spent} |")
            continue
        decision = (
            "no difference shown"
            if not r["reject"]
            else (f"{e['a']} better" if c["difference"] > 0 else f"{e['b']} better")
        )
        lines.append(
            f"{where} {c['difference']:+.3f} | {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f} | {sign_text(c)} | "
            f"{p_text(r['p'])} | {p_text(r['p_holm'])} | {decision} | {spent} |"
        )
    lines.append("")
    if charged:
        lines += [
            f"Tuning charged: {', '.join(dict.fromkeys(charged))} spent at most that share of the budget in each "
            "final cell and each trial (`budget_share`), so a final model with its share of the trials costs the budget.",
            "",
        ]
    if short:
        lines += [
            f"Spent under {SPENT_IN_FULL:.0%} of what it may spend: {', '.join(dict.fromkeys(short))}. Such a side stopped "
            "early (its iteration or step cap, or its regime target: the regime table says which), so its "
            "comparison is of that method as this bench ran it, not at the budget's compute.",
            "",
        ]
    return lines


# a side of a primary comparison that used less than this share of its budget is named under the table
SPENT_IN_FULL = 0.9


def _spent_text(c: dict, budget: float) -> str:
    """Both sides' mean FLOPs used and their share of the budget (none for a side that spends nothing, the
    base or sampling from it)."""
    return " / ".join(
        f"{f:.2g}" + (f" ({f / budget:.0%})" if budget and f else "") for f in (c["flops_a"], c["flops_b"])
    )


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
            f"| {c['a']} vs {c['b']} | {c['task']} | {c['setting']} | {budget_text(c['budget'])} | "
            f"{c['difference']:+.3f} | {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f} | {per} | {signs} | "
            f"{c.get('flops_a', 0.0):.2g} / {c.get('flops_b', 0.0):.2g} |"
        )
    lines.append("")
    return lines


def headline_table(cfg: BenchConfig, rows: list[dict]) -> list[str]:
    """One table: per task and method (cell label), its best single model at each budget, i.e. the
    row with one inference pass per example (RandOpt top-1, not its K-vote; self-consistency@1), in the
    headline data setting; with passes/example and labelled examples. Where a method has several
    single-pass rows the first in the config's order is shown (choosing by test accuracy would select on test)."""
    setting = headline_setting(cfg)
    lines = [
        f"## Headline: best single model per method ({setting}; test accuracy, mean ± sd over seeds)",
        "",
        "| task | method | labelled | passes/ex | " + " | ".join(budget_text(b) for b in cfg.budgets) + " |",
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
                got = at_budget(rows, task, setting, b).get(name, []) if name else []
                if not got:
                    cells.append("does not fit" if unfit_seeds(rows, task, setting, b, cell_label) else "—")
                    continue
                labelled = labelled_text(cfg, got[0])
                unfit = unfit_seeds(rows, task, setting, b, name)
                cells.append(f"{spread_text(cfg, got, len(unfit))} ({statistics.fmean(g['flops'] for g in got):.2g} F)")
            lines.append(
                f"| {cfg.label(task)} | {name or cell_label} | {labelled} | {passes} | " + " | ".join(cells) + " |"
            )
    return lines + [""]


def papers_section(cfg: BenchConfig, rows: list[dict]) -> list[str]:
    """The CoRP paper's comparisons: per task, setting and budget, each CoRP row beside RandOpt top-1
    and vote@K on its own population (population_rows) and the share of the vote's gain over top-1
    CoRP recovers; then `ratio_compare` (CoRP at N against RandOpt at RATIO x N)."""
    lines = []
    if cfg.population_rows:
        lines += _population_section(cfg, rows)
    return lines + _ratio_section(cfg, rows)


def _population_section(cfg: BenchConfig, rows: list[dict]) -> list[str]:
    """`papers_section`'s table of RandOpt on CoRP's own population (empty: no such rows)."""
    table = []
    for task in cfg.tasks:
        for setting in cfg.settings:
            for budget in cfg.budgets:
                by = at_budget(rows, task, setting, budget)
                for name in [n for n in by if f"{n}/randopt-top1" in by]:
                    table.append(_population_line(cfg, task, setting, budget, by, name))
    if not table:
        return []
    return [
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


def _population_line(cfg: BenchConfig, task: str, setting: str, budget, by: dict, name: str) -> str:
    """One CoRP row beside RandOpt top-1 and its largest vote@K on the same population."""
    mean = {k: statistics.fmean(r["accuracy"] for r in v) for k, v in by.items()}
    votes = sorted((n for n in by if n.startswith(f"{name}/randopt-vote@")), key=lambda n: int(n.split("@")[1]))
    top1 = mean[f"{name}/randopt-top1"]
    vote = votes[-1] if votes else None
    share = ""
    if vote and mean[vote] != top1:
        share = f"{(mean[name] - top1) / (mean[vote] - top1):+.2f}"
    flops = statistics.fmean(r["flops"] for r in by[name])
    pop = statistics.fmean(r["flops"] for r in by[f"{name}/randopt-top1"])
    return (
        f"| {cfg.label(task)} | {setting} | {budget_text(budget)} | {name} {mean[name]:.3f} | "
        f"{top1:.3f} | {'' if vote is None else f'{vote.split(chr(47))[1]} {mean[vote]:.3f}'} | {share} | "
        f"{flops:.2g} / {pop:.2g} |"
    )


def _ratio_section(cfg: BenchConfig, rows: list[dict]) -> list[str]:
    """`papers_section`'s table of `ratio_compare` (empty: none configured or none computed)."""
    lines = []
    ratios = ratio_comparisons(cfg, rows)
    if ratios:
        lines += [
            "## At N against RATIO x N specialists",
            "",
            "| a (budget, units) | b (budget, units) | task | setting | difference | 95% interval | signs | FLOPs (a / b) |",
            "|---|---|---|---|---:|---|---|---|",
        ]
        for c in ratios:
            left = f"{c['a']} ({budget_text(c['budget'])}, {c['units_a']:.3g})"
            if c.get("abstained_a"):
                left += f" * ({c['abstained_a']} of {c['seeds_a']} seeds)"
            if not c["reached"]:
                lines.append(
                    f"| {left} | {c['b']}: no budget reaches {c['ratio']:g} x {c['units_a']:.3g} (at most {c['units_b']:.3g}) "
                    f"| {c['task']} | {c['setting']} | | | | |"
                )
                continue
            iv = f"{c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}"
            signs = sign_text(c) if c.get("n_seeds", 1) > 1 else "one seed only, no claim"
            lines.append(
                f"| {left} | {c['b']} ({budget_text(c['budget_b'])}, {c['units_b']:.3g}) | {c['task']} | {c['setting']} | "
                f"{c['difference']:+.3f} | {iv} | {signs} | {c['flops_a']:.2g} / {c['flops_b']:.2g} |"
            )
        lines += [
            "",
            "Units: mean over seeds (specialists for population methods); b at the smallest budget reaching the ratio. "
            "`*`: a's gate abstained (kept the base) in that many seeds; where it did in every seed, the row compares "
            "the base with b, not a at N.",
            "",
        ]
    return lines


def protocol_sections(
    cfg: BenchConfig, rows: list[dict], records: list[dict], tuning: list[dict], regime: list[dict] | None
) -> list[str]:
    """The third edition's sections (each absent from an older config's table.md); `regime`: `regime_rows`'
    (None where the config asks for no protocol tables)."""

    lines = papers_section(cfg, rows)
    if regime is not None:
        setting = headline_setting(cfg)
        lines += compute_table(cfg, records, tuning, setting) + regime_table(regime, setting)
    return lines


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
            f"| {t['a']} vs {t['b']} | {t['task']} | {t['setting']} | {budget_text(t['budget'])} | ±{t['margin']:g} |"
        )
        x = t["test"]
        if x is None:
            lines.append(f"{where} | | | fewer than 2 seeds with both rows |")
            continue
        decision = f"equivalent within ±{t['margin']:g}" if x["equivalent"] else "equivalence not shown"
        lines.append(f"{where} {x['mean']:+.3f} | {x['ci'][0]:+.3f} to {x['ci'][1]:+.3f} | {x['p']:.3g} | {decision} |")
    return lines + [""]
