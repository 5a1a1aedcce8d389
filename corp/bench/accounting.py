"""What each method really spent, and the regime it reached (the third edition's report sections,
`protocol_tables: true`; issue 39).

Compute of one run (a trial or a final cell's method variant on one seed: its records over budgets):
- population methods (RandOpt, CoRP): the population prefix scored (the largest any budget read),
  plus the own evaluations of every try (each try is a whole run of the method: CoRP's step search
  and gates rerun for every prefix tried), plus, for a trial, the evaluation of every try on the
  tuning split. A try's own evaluations are recorded (`tried[].own`); an older record's are its
  FLOPs less its prefix's scoring at the per-specialist cost of the chosen try (`own_flops`), or of
  a line through its tries;
- iterative methods (ES, GRPO, ...): one training run grown through every budget, so the largest
  ledger any growth reached, plus, for a trial, one evaluation per distinct checkpoint evaluated;
- fixed methods (self-consistency): nothing charged; a trial's evaluation on the tuning split is its
  search (self-consistency@K samples K answers per example, and @1 is a share of those).
Discarded: what ran and was thrown away: tries other than the chosen one (their own evaluations),
an iterative run's growth past the top budget. A final cell's test evaluation is the measurement,
never charged; a trial's evaluation on its tuning split is search, and is.
"""

from __future__ import annotations

import statistics

from corp.bench.config import REGIME_TARGETS
from corp.method import FIXED, POPULATION, BenchAdapter
from corp.methods import get_method


def eval_flops(rec: dict) -> float:
    """FLOPs of the evaluation a record's rows report (the largest row: a vote@K's ledger holds its
    top-1's, self-consistency@1 is a share of @K's samples; the greedy base is the base's, not the method's)."""
    return max((float(r.get("test_flops") or 0.0) for r in rec.get("rows", []) if r["name"] != "base"), default=0.0)


def _tries_own(rec: dict) -> list[float]:
    """Each try's own evaluations (see the module docstring for records made before they were recorded)."""
    tried = rec.get("tried") or []
    if all("own" in t for t in tried):
        return [float(t["own"]) for t in tried]
    per = None
    if rec.get("own_flops") is not None and rec.get("units"):
        per = (float(rec["flops"]) - float(rec["own_flops"])) / int(rec["units"])
    elif len({t["units"] for t in tried}) >= 2:  # a least-squares line flops = per * units + own
        us, fs = [t["units"] for t in tried], [t["flops"] for t in tried]
        mu, mf = statistics.fmean(us), statistics.fmean(fs)
        per = sum((u - mu) * (f - mf) for u, f in zip(us, fs)) / sum((u - mu) ** 2 for u in us)
    if per is None:
        return [0.0 for _ in tried]
    return [max(0.0, float(t["flops"]) - per * int(t["units"])) for t in tried]


def run_compute(recs: list[dict], trial: bool) -> dict:
    """{charged, spent, discarded, evaluation} of one run's records over its budgets (module docstring).
    `charged`: the largest budget's cell's FLOPs; `spent`: everything the run computed toward its rows."""
    done = [r for r in recs if r.get("status") == "done"]
    charged = max((float(r["flops"]) for r in done), default=0.0)
    kind = recs[0].get("kind")
    evaluation = discarded = spent = 0.0
    if kind == "population":
        scoring = max((float(r["flops"]) - float(r.get("own_flops") or 0.0) for r in done), default=0.0)
        for r in recs:
            own = _tries_own(r)
            chosen = [
                i for i, t in enumerate(r.get("tried") or []) if r.get("status") == "done" and t["units"] == r["units"]
            ]
            keep = chosen[-1] if chosen else None
            discarded += sum(o for i, o in enumerate(own) if i != keep)
            spent += sum(own)
            if trial:
                evaluation += len(own or [0]) * eval_flops(r)
        # a record made before tries were recorded (or a raced cell) charged its own FLOPs
        spent = max(spent + scoring, charged)
    elif kind == "iterative":
        grown = [g for r in recs for g in (r.get("grown") or r.get("tried") or [])]
        spent = max([charged, *(float(g["flops"]) for g in grown)])
        discarded = spent - charged
        if trial:
            evaluation = len({g["units"] for g in grown} or {0}) * max((eval_flops(r) for r in done), default=0.0)
    elif trial:  # fixed: its only compute is the evaluation
        evaluation = sum(eval_flops(r) for r in done)
    return {"charged": charged, "spent": spent + evaluation, "discarded": discarded, "evaluation": evaluation}


def _runs(records: list[dict], setting: str | None) -> dict[tuple, list[dict]]:
    """Records grouped per run: (task, label, seed, trial) over budgets (one setting, or the trials)."""
    out: dict[tuple, list[dict]] = {}
    for r in records:
        if setting is None or r["setting"] == setting:
            out.setdefault((r["task"], r["label"], r["seed"], r.get("trial")), []).append(r)
    return out


def compute_summary(records: list[dict], tuning: list[dict], setting: str) -> dict[tuple, dict]:
    """Per (task, cell label): the final cells' charged, discarded and spent FLOPs at the top of their
    runs (mean over seeds), and the search's total (every trial on every seed it ran)."""
    out: dict[tuple, dict] = {}
    for (task, label, _, _), recs in _runs(records, setting).items():
        c = run_compute(recs, trial=False)
        d = out.setdefault((task, label), {"final": [], "search": 0.0, "trials": set(), "tune_seeds": set()})
        d["final"].append(c)
    for (task, label, seed, trial), recs in _runs(tuning, None).items():
        d = out.setdefault((task, label), {"final": [], "search": 0.0, "trials": set(), "tune_seeds": set()})
        d["search"] += run_compute(recs, trial=True)["spent"]
        d["trials"].add(trial)
        d["tune_seeds"].add(seed)
    return out


def compute_table(cfg, records: list[dict], tuning: list[dict], setting: str) -> list[str]:
    summary = compute_summary(records, tuning, setting)
    if not summary:
        return []
    lines = [
        f"## Compute per method, search included ({setting}; FLOPs)",
        "",
        "| task | method | final cell, charged (mean over seeds) | final cell, discarded tries | search: trials x seeds "
        "| search FLOPs | total per final model (charged + discarded + search) | total / charged |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for (task, label), d in summary.items():
        charged = statistics.fmean(c["charged"] for c in d["final"]) if d["final"] else 0.0
        discarded = statistics.fmean(c["discarded"] for c in d["final"]) if d["final"] else 0.0
        total = charged + discarded + d["search"]
        trials = f"{len(d['trials'])} x {len(d['tune_seeds'])}" if d["trials"] else "none"
        lines.append(
            f"| {cfg.label(task)} | {label} | {charged:.3g} | {discarded:.3g} | {trials} | {d['search']:.3g} | "
            f"{total:.3g} | {total / charged:.2f} |"
            if charged
            else f"| {cfg.label(task)} | {label} | 0 | {discarded:.3g} | {trials} | {d['search']:.3g} | {total:.3g} | — |"
        )
    lines += [
        "",
        "Charged: the FLOPs of the final cell at the top of its run (its largest budget), as the tables state them. "
        "Discarded: what final cells ran and threw away (tries other than the chosen prefix, their own evaluations; "
        "an iterative run's growth past its top budget). Search: every trial on every seed it ran, its "
        "training/selection, its discarded tries and its evaluations on the tuning split "
        "(corp.bench.accounting). A final cell's test evaluation is never charged. A population shared by trials and "
        "final cells (the same seed and splits) is counted in both.",
        "",
    ]
    return lines


# ----------------------------------------------------------------------------- regime and examples


def targets(cfg, method: str) -> dict:
    return dict((cfg.regime_targets or {}).get(method, REGIME_TARGETS.get(method, {})))


def regime_of(rec: dict) -> dict:
    """What a final record reached: its units and the options a regime target may name."""
    return {"units": rec.get("units"), **(rec.get("hyperparameters") or {})}


def _regime_text(adapter: BenchAdapter, kind: str, got: dict) -> str:
    u = got.get("units")
    if kind == FIXED:
        return "no training"
    if adapter.reached is not None:  # the method's own words (CoRP's support, ES's population, FGRPO's rounds)
        return adapter.reached(got)
    if kind == POPULATION:
        return f"{u:.3g} specialists"
    return f"{u:.3g} optimizer steps"


def _every_labelled(opts: dict, seed: int, units) -> int:
    return sum(int(opts.get(k) or 0) for k in ("n_support", "n_probe", "n_validation"))


def regime_rows(cfg, records: list[dict], setting: str) -> list[dict]:
    """Per task and method variant, at the top budget: the regime reached (mean over seeds), its target,
    the targets it falls short of (`below`), the distinct labelled examples touched, and below target its
    curve over budgets (units and accuracy of its first row at each budget). bench.json keeps these rows;
    the regime table and the README's sentence on a method below its regime are both made from them."""

    top = max(cfg.budgets)
    final = [r for r in records if r["setting"] == setting and r.get("status") == "done"]
    out = []
    for task, label, method in dict.fromkeys((r["task"], r["label"], r["method"]) for r in final):
        mine = [r for r in final if (r["task"], r["label"]) == (task, label)]
        at_top = [r for r in mine if r["budget"] in (top, None)]
        row = {"task": cfg.label(task), "method": label, "top_budget": top}
        if not at_top:
            out.append(row | {"reached": None})
            continue
        adapter = get_method(method).bench
        kind = at_top[0].get("kind", adapter.kind)
        got = regime_of(at_top[0])
        if kind != "fixed":
            got["units"] = statistics.fmean(float(r.get("units") or 0) for r in at_top)
        want = targets(cfg, method)
        short = [k for k, v in want.items() if float(got.get(k) or 0) < float(v)]
        count = adapter.touched or _every_labelled
        touched = [count(r.get("hyperparameters") or {}, r["seed"], r.get("units")) for r in at_top]
        curve = []
        if short:
            for b in cfg.budgets:
                got_b = [r for r in mine if r["budget"] == b and r["rows"]]
                if got_b:
                    units = statistics.fmean(float(r.get("units") or 0) for r in got_b)
                    curve.append(
                        {
                            "budget": b,
                            "units": units,
                            "accuracy": statistics.fmean(r["rows"][0]["accuracy"] for r in got_b),
                        }
                    )
        out.append(
            row
            | {
                "reached": _regime_text(adapter, kind, got),
                "target": {k: float(v) for k, v in want.items()},
                "below": short,
                "touched": None if any(t is None for t in touched) else statistics.fmean(touched),
                "tuning_split": cfg.tune_split if at_top[0].get("tuning") else None,
                "curve": curve,
            }
        )
    return out


def target_text(row: dict) -> str:
    return ", ".join(f"{k} >= {v:g}" for k, v in row["target"].items()) or "—"


def regime_table(regime: list[dict], setting: str) -> list[str]:
    """The regime table of `regime_rows`' rows."""

    if not regime:
        return []
    lines = [
        f"## Regime reached and labelled examples touched ({setting}, top budget {regime[0]['top_budget']:.2g} FLOPs)",
        "",
        "| task | method | regime at the top budget | target | reached | labelled examples touched | curve below target "
        "(budget: units, accuracy) |",
        "|---|---|---|---|---|---:|---|",
    ]
    for r in regime:
        if r["reached"] is None:
            lines.append(f"| {r['task']} | {r['method']} | not at the top budget | | | | |")
            continue
        touched = "—" if r["touched"] is None else f"{r['touched']:.4g}"
        if r["tuning_split"]:
            touched += f" (+ {r['tuning_split']} for tuning)"
        curve = "; ".join(f"{c['budget']:.2g}: {c['units']:.3g}, {c['accuracy']:.3f}" for c in r["curve"])
        reached = "—" if not r["target"] else ("yes" if not r["below"] else f"**below** ({', '.join(r['below'])})")
        lines.append(
            f"| {r['task']} | {r['method']} | {r['reached']} | {target_text(r)} | {reached} | {touched} | {curve} |"
        )
    lines += [
        "",
        "Targets: corp.bench.config.REGIME_TARGETS (the issue's: RandOpt 50 specialists, CoRP 200 on 64 support "
        "examples, ES population 30 x 100 iterations, GRPO and F-TIS 100 steps), or the config's `regime_targets`. "
        "Labelled examples touched: the distinct examples a final run scored or trained on (RandOpt its support; "
        "CoRP support, probe and validation; ES and GRPO the union of their per-iteration/step draws, "
        "reconstructed from the seed; — where the draw is not reconstructed), mean over seeds.",
        "",
    ]
    return lines
