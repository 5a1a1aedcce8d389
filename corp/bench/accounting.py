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


def _regime_text(method: str, kind: str, got: dict) -> str:
    u = got.get("units")
    if kind == "fixed":
        return "no training"
    if method == "consolidate":
        return f"{u:.3g} specialists on {got.get('n_support', '?')} support"
    if kind == "population":
        return f"{u:.3g} specialists"
    if method == "es":
        return f"population {got.get('population', '?')} x {u:.3g} iterations"
    if method == "fgrpo":
        return f"{u:.3g} rounds"
    return f"{u:.3g} optimizer steps"


def _every_labelled(opts: dict, seed: int, units) -> int:
    return sum(int(opts.get(k) or 0) for k in ("n_support", "n_probe", "n_validation"))


def regime_table(cfg, records: list[dict], setting: str) -> list[str]:
    """Per task and method variant, at the top budget: the regime reached (mean over seeds), its target,
    and the distinct labelled examples touched; below target, its curve over budgets (units and
    accuracy of its first row at each budget)."""

    top = max(cfg.budgets)
    final = [r for r in records if r["setting"] == setting and r.get("status") == "done"]
    keys = list(dict.fromkeys((r["task"], r["label"], r["method"]) for r in final))
    if not keys:
        return []
    lines = [
        f"## Regime reached and labelled examples touched ({setting}, top budget {top:.2g} FLOPs)",
        "",
        "| task | method | regime at the top budget | target | reached | labelled examples touched | curve below target "
        "(budget: units, accuracy) |",
        "|---|---|---|---|---|---:|---|",
    ]
    for task, label, method in keys:
        mine = [r for r in final if (r["task"], r["label"]) == (task, label)]
        at_top = [r for r in mine if r["budget"] in (top, None)]
        if not at_top:
            lines.append(f"| {cfg.label(task)} | {label} | not at the top budget | | | | |")
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
        touched_text = "—" if any(t is None for t in touched) else f"{statistics.fmean(touched):.4g}"
        if at_top[0].get("tuning"):
            touched_text += f" (+ {cfg.tune_split} for tuning)"
        curve = ""
        if short:
            pts = []
            for b in cfg.budgets:
                got_b = [r for r in mine if r["budget"] == b and r["rows"]]
                if got_b:
                    units = statistics.fmean(float(r.get("units") or 0) for r in got_b)
                    acc = statistics.fmean(r["rows"][0]["accuracy"] for r in got_b)
                    pts.append(f"{b:.2g}: {units:.3g}, {acc:.3f}")
            curve = "; ".join(pts)
        want_text = ", ".join(f"{k} >= {v:g}" for k, v in want.items()) or "—"
        reached = "—" if not want else ("yes" if not short else f"**below** ({', '.join(short)})")
        lines.append(
            f"| {cfg.label(task)} | {label} | {_regime_text(method, kind, got)} | {want_text} | {reached} | "
            f"{touched_text} | {curve} |"
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
