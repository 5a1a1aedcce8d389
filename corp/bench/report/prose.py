"""The sentences of table.md and the README section, written from rows and comparisons: the
protocol, the regime, what each headline row is, and which comparisons are claims (an interval
that excludes zero) and which are not."""

from __future__ import annotations

import statistics

from corp.algorithms.stats import examples_text, sign_text
from corp.bench.config import (
    BenchConfig,
    at_budget,
    budget_text,
    headline_setting,
)
from corp.bench.report.rows import LABEL_PRIOR, mean_sd
from corp.evaluate.tasks import get_task


def dropped_text(c: dict) -> str:
    """A comparison's left-out seeds, grouped by why: 'seeds 1, 2 not run yet; seed 3 corp-stage1 does not fit'."""
    by: dict[str, list] = {}
    for s, why in (c.get("seeds_dropped") or {}).items():
        by.setdefault(why, []).append(str(s))
    return "; ".join(f"seed{'s' if len(ss) > 1 else ''} {', '.join(ss)}: {why}" for why, ss in by.items())


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
        tune = cfg.tuning_seeds
        seeds = ", ".join(str(x) for x in tune)
        shared = sorted(set(tune) & set(cfg.seeds))
        apart = (
            f"seeds the final cells also run on ({', '.join(map(str, shared))})"
            if shared
            else "seeds of their own, none a final seed"
        )
        return (
            f"Hyperparameters: search. Each of {', '.join(searched)} got {cfg.trials} trials (grid points drawn by a "
            f"fixed seed), each run on seed{'s' if len(tune) > 1 else ''} {seeds} ({apart}) with the "
            f"{cfg.tune_setting} setting's splits and scored on the {tune_split_text(cfg)}, never on test; a trial's "
            f"score is its mean over those seeds, and the best trial's options (results.csv) were used for every seed in {settings}. Every "
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


def tuned_apart(cfg: BenchConfig) -> bool:
    """Whether the trials ran under the third edition's tuning fields (not the second edition's defaults)."""
    return (cfg.tune_setting, cfg.tune_split, cfg.tune_seeds, cfg.tune_options) != ("paper", "validation", 1, {})


def tune_split_text(cfg: BenchConfig) -> str:
    """'64-example validation split', '400-example dev split' (the tasks' `dev=N`, the development pool a
    trial scores whole), or 'dev split' where the tasks' sizes differ or are not given."""
    n = cfg.n_validation if cfg.tune_split == "validation" else cfg.tune_options.get(f"n_{cfg.tune_split}")
    if not n and cfg.tune_split == "dev":
        sizes = {get_task(t, cfg.data).signature().get("dev") for t in cfg.tasks}  # the task's own dev=N
        n = sizes.pop() if len(sizes) == 1 else None
    return f"{n}-example {cfg.tune_split} split" if n else f"{cfg.tune_split} split"


def labelled_text(cfg: BenchConfig, row: dict) -> str:
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


def _flops_text(c: dict) -> str:
    return f"{c['a']} {c.get('flops_a', 0.0):.2g} FLOPs, {c['b']} {c.get('flops_b', 0.0):.2g} FLOPs"


def p_text(p) -> str:
    return "—" if p is None else f"{p:.3g}"


def primary_sentences(primary: list[dict]) -> list[str]:
    """One sentence per registered comparison; 'beats' only where Holm's adjusted p is <= 0.05."""
    out = []
    for r in primary:
        e, c = r["entry"], r["comparison"]
        where = f"on {e['task_label']} ({e['setting']}, budget {budget_text(e['budget'])} FLOPs"
        if c is None:
            out.append(f"{e['a']} vs {e['b']} {where}): not run yet.")
            continue
        where += f"; {_flops_text(c)})"
        if c.get("n_seeds", 1) < 2:
            out.append(f"{e['a']} vs {e['b']} {where}: one seed only, no claim ({c['difference']:+.3f}).")
            continue
        stat = (
            f"95% CI {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}, p = {p_text(r['p'])}, Holm p = "
            f"{p_text(r['p_holm'])}, signs {sign_text(c)}, {examples_text(c)}"
        )
        if r["reject"] and c["difference"] > 0:
            out.append(f"{e['a']} beats {e['b']} {where} by {c['difference']:+.3f} ({stat}).")
        elif r["reject"]:
            out.append(f"{e['b']} beats {e['a']} {where} by {-c['difference']:+.3f} ({stat}).")
        else:
            out.append(f"{e['a']} vs {e['b']} {where}: no difference shown ({c['difference']:+.3f}, {stat}).")
    return out


def spread_text(cfg: BenchConfig, got: list[dict], unfit: int = 0) -> str:
    """Mean ± sd over seeds; with fewer seeds than configured says how many, and how many of the others do
    not fit the budget (the rest are not run yet), never a bare ± 0."""
    m, sd = mean_sd([g["accuracy"] for g in got])
    if got[0]["method"] == LABEL_PRIOR:  # the same in every seed by construction: no spread to state
        return f"{m:.3f} (reference)"
    planned = len(cfg.seeds_for(got[0]["task"], got[0].get("cell")))  # the task's, or its method's own
    if len(got) == planned:
        return f"{m:.3f} ± {sd:.3f}"
    why = f"; {unfit} do{'es' if unfit == 1 else ''} not fit" if unfit else ""
    return f"{m:.3f} ({len(got)} of {planned} seeds{'' if len(got) == 1 else f', sd {sd:.3f}'}{why})"


def seeds_text(cfg: BenchConfig) -> str:
    """The seeds, with the tasks and methods that run a subset of them (a task entry's or a method's `seeds`)."""
    own = [f"{cfg.label(t)}: {', '.join(map(str, cfg.seeds_of(t)))}" for t in cfg.tasks if cfg.seeds_of(t) != cfg.seeds]
    own += [
        f"{n}: {', '.join(map(str, spec['seeds']))}" for n, spec in cfg.methods.items() if (spec or {}).get("seeds")
    ]
    return ", ".join(map(str, cfg.seeds)) + (f" ({'; '.join(own)})" if own else "")


def regime_text(cfg: BenchConfig) -> str:
    """What regime the bench ran in, in plain words (the README section states it)."""
    return (
        f"Regime: {cfg.model}; tasks {', '.join(cfg.label(t) for t in cfg.tasks)}; seeds "
        f"{seeds_text(cfg)}; budgets {', '.join(budget_text(b) for b in cfg.budgets)} FLOPs; shared "
        f"population {cfg.population} specialists (sigmas {', '.join(f'{x:g}' for x in cfg.sigmas)}); splits support "
        f"{cfg.n_support}, probe {cfg.n_probe}, validation {cfg.n_validation}, test {cfg.n_test}; data settings "
        f"{', '.join(cfg.settings)} (headline: {headline_setting(cfg)}); hyperparameters: {cfg.hyperparameters}"
        + (
            (
                f" ({cfg.trials} trials per searched method, on {cfg.tune_split}"
                + (f", {len(cfg.tuning_seeds)} seeds, {cfg.tune_setting} setting" if tuned_apart(cfg) else "")
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
        where = f"on {c['task']} ({c['setting']}, budget {budget_text(c['budget'])} FLOPs; {_flops_text(c)})"
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
        by.setdefault((c["a"], c["b"]), {}).setdefault(c["task_label"], []).append(budget_text(c["budget"]))
    return "; ".join(
        f"{a} vs {b} (" + "; ".join(f"{t} " + ", ".join(bs) for t, bs in where.items()) + ")"
        for (a, b), where in by.items()
    )


def reading_lines(
    cfg: BenchConfig,
    rows: list[dict],
    comps: list[dict],
    primary: list[dict] | None = None,
    with_primary: bool = True,
) -> list[str]:
    """What the headline shows, in plain words, from the rows and comparisons alone (nothing typed in by
    hand): per task, the highest single-model mean at the top budget beside the base and, where the
    majority-answer reference is at or above it, that the task's gains mostly measure its label prior;
    then the claims (only comparisons whose across-seed interval excludes 0, in full), and the
    comparisons that show no difference or have one seed only, grouped by pair. A highest mean is a
    description, not a claim: whether it beats the next row is said by the claims alone. `with_primary`
    False leaves out the registered comparisons' sentences (the README shows them as a table), not the
    exclusion of the registered comparisons from the exploratory ones."""
    setting = headline_setting(cfg)
    top = cfg.budgets[-1]
    out = []
    for task in cfg.tasks:
        text = _highest_text(cfg, rows, task, setting, top)
        if text is None:
            continue
        out += [text + ".", ""]
    if primary is not None:  # the registered family is the only source of claims; the rest are exploratory
        if with_primary:
            out += [
                f"Primary comparisons (pre-registered, Holm over all {len(primary)}; a claim needs Holm p <= 0.05):"
            ]
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


def _highest_text(cfg: BenchConfig, rows: list[dict], task: str, setting: str, top) -> str | None:
    """`reading_lines`' sentence for one task: its highest single-model mean at the top budget, beside the base,
    and the label prior where that is at or above it (None: the task has no single-model row there)."""
    by = at_budget(rows, task, setting, top)
    single = {n: got for n, got in by.items() if n not in ("base", LABEL_PRIOR) and got[0]["passes_per_example"] == 1}
    if not single:
        return None
    means = {n: statistics.fmean(r["accuracy"] for r in got) for n, got in single.items()}
    best = max(means, key=lambda n: means[n])
    k = len({r["seed"] for r in single[best]})
    text = (
        f"On {cfg.label(task)} at {budget_text(top)} FLOPs ({setting}), the highest mean test accuracy of a "
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
    return text


def _seeds_range(comps: list[dict]) -> str:
    ks = sorted({c.get("n_seeds", 1) for c in comps})
    return str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}"
