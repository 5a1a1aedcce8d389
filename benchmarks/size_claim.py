"""The size claim (issue 54; results/size-claim/REGISTRATION.md as amended by AMENDMENT-1.md): density of good specialists and test gains per model size.

Reads, per model, what `corp bench` wrote for it (one results directory, or one per seed: each holds
`cells/*.json`, the cell records, and `populations/<run>/`, the shared population runs that
benchmarks/bench_run.sh commits). It reads the finished final cells at one budget (`--budget`, default the
largest the model ran) and the budget-free ones (the base's), one CoRP variant (`--corp LABEL` when there
are several); the model's name and parameter count come from its population run (population_meta.json,
report.json's selection ledger). Per model and seed it computes:

  1. density: the share of the population's specialists whose support accuracy beats the base's by at
     least `--margin` support examples (default 4, of 64), counted on the same support examples. The
     base's support row is read from the population run (`evals.jsonl` or `population.jsonl`: a row of
     `what` "base" on split "support" with the specialists' `ids_hash`); where there is none the density
     is reported missing, naming that row, never estimated;
  2. RandOpt top-1's test gain over the base, 3. CoRP's, 4. vote@K's (`--vote-k`, default 4, the registered K; if present):
     paired on the test examples of the cell records (`rows[].correct`, in `example_ids` order). RandOpt's
     rows are those the CoRP cell carries on its own population (`population_row`), else a randopt cell's.
     A CoRP cell whose gate kept the base (its report row `corp (abstained=base)`) deploys the base: its
     gain is 0 by definition (the base's own outcomes are used), and the seed is marked abstained.

Across seeds, each with a 95% interval: density, a t interval over seeds' values (k - 1 df); a test gain,
corp.algorithms.stats.seed_example_interval (the bench's own interval: t over seeds plus the test examples'
sampling term) when the seeds share their test examples, else a t interval over the per-seed gains; one
seed gives a value with no interval. The three registered primaries of the plan, largest model (L) against
smallest (S) by parameter count: density(L) - density(S); [CoRP - top-1](L) - [CoRP - top-1](S) (both
Welch: independent models, se = sqrt(se_L^2 + se_S^2), Welch-Satterthwaite df); CoRP - base at L; their
two-sided p-values Holm-adjusted together (corp.algorithms.stats.holm: a primary not computable yet keeps
its place in the family and is never rejected).

Writes OUT/size_claim.json, OUT/size_claim.md and, when matplotlib imports, OUT/size_claim.png (density and
test gains against parameters on a log axis, RandOpt's published Countdown densities beside them, labelled
as the paper's: another task and model family). A model with no finished cells says "no result yet".

    python benchmarks/size_claim.py --out results/size-claim/analysis \\
        --model results/size-claim/smollm2-135m \\
        --model results/size-claim/gemma3-270m \\
        --model results/size-claim/qwen-s0 results/size-claim/qwen-s1 [--margin 4] [--corp LABEL] [--vote-k 4] [--budget FLOPS] [--seeds 0,1,2,3,4]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy import stats as scipy_stats

from corp.algorithms.stats import compare_paired, holm, seed_example_interval
from corp.runtime.runs import read_json, read_jsonl, write_json

NO_RESULT = "no result yet"
# RandOpt (Gan & Isola, arXiv 2603.12228), Countdown, Qwen2.5, N = 100 specialists, K = 25: (parameters, density)
PAPER_DENSITY = [(0.5e9, 0.077), (1.5e9, 0.357), (3e9, 0.495)]
PAPER_LABEL = "RandOpt paper: Countdown, Qwen2.5, N=100 (another task)"
GAINS = ("top1", "corp", "vote")


# ----------------------------------------------------------------------------- reading the bench's files


def load_cells(dirs: list[Path]) -> list[dict]:
    """The finished final cells (no tuning trials) of every results directory, each with `_dir` (where it lies)."""
    out = []
    for d in dirs:
        for path in sorted((d / "cells").glob("*.json")) if (d / "cells").is_dir() else []:
            rec = read_json(path)
            if rec.get("status") == "done" and rec.get("setting") != "tune" and "trial" not in rec:
                out.append({**rec, "_dir": d})
    return out


def population_dir(rec: dict) -> Path | None:
    """The population run a cell read: where the record says, else the copy bench_run.sh committed beside it."""
    named = rec.get("population_run")
    if not named:
        return None
    for cand in (Path(named), rec["_dir"] / "populations" / Path(named).name):
        if (cand / "population.jsonl").exists():
            return cand
    return None


def support_rows(pop: Path) -> tuple[list[dict], dict | None]:
    """The population's specialists on the support split (population order) and the base's row there, if any."""
    rows = read_jsonl(pop / "population.jsonl", key="key", unique=True, repair=False)
    specs = sorted(
        (r for r in rows if r.get("kind") == "specialist" and r.get("split") == "support"), key=lambda r: r["index"]
    )
    evals = pop / "evals.jsonl"
    rows += read_jsonl(evals, key="key", repair=False) if evals.exists() else []
    hashes = {r["ids_hash"] for r in specs}
    bases = [r for r in rows if r.get("what") == "base" and r.get("split") == "support" and r["ids_hash"] in hashes]
    return specs, (bases[0] if bases else None)


def model_identity(pop: Path | None, dirs: list[Path]) -> tuple[str, int | None]:
    """The model's alias (population_meta.json) and parameter count (the population report's ledger)."""
    if pop is None:
        return dirs[0].name, None
    name = read_json(pop / "population_meta.json").get("model_name") or dirs[0].name
    report = pop / "report.json"
    ledger = read_json(report).get("population", {}).get("selection_ledger", {}) if report.exists() else {}
    return name, ledger.get("n_params")


# ----------------------------------------------------------------------------- one seed


def density(specs: list[dict], base: dict | None, margin: int) -> dict:
    """Share of specialists whose support correct count beats the base's by >= margin examples, with counts by sigma."""
    if not specs:
        return {"value": None, "missing": "no specialist rows in population.jsonl"}
    if base is None:
        return {
            "value": None,
            "n": len(specs),
            "missing": "no base row on the support split (what 'base', split 'support', the specialists' ids_hash) "
            "in the population run's evals.jsonl or population.jsonl: score the population with --score-base "
            "(corp bench does)",
        }
    floor = sum(base["correct"]) + margin
    beats = [sum(r["correct"]) >= floor for r in specs]
    by_sigma: dict[str, list[int]] = {}
    for r, b in zip(specs, beats):
        by_sigma.setdefault(repr(float(r["sigma"])), [0, 0])
        by_sigma[repr(float(r["sigma"]))][0] += int(b)
        by_sigma[repr(float(r["sigma"]))][1] += 1
    return {
        "value": sum(beats) / len(beats),
        "n": len(specs),
        "beats": sum(beats),
        "base_support_correct": sum(base["correct"]),
        "n_support": len(base["correct"]),
        "by_sigma": {s: {"beats": b, "n": n} for s, (b, n) in by_sigma.items()},
    }


def at_budget(cells: list[dict], budget: float | None) -> list[dict]:
    """The cells at one budget (default the largest the model's cells ran), with the budget-free ones (the base's)."""
    budgets = {float(c["budget"]) for c in cells if c.get("budget") is not None}
    top = budget if budget is not None else max(budgets, default=None)
    return [c for c in cells if c.get("budget") is None or float(c["budget"]) == top]


def pick_corp(cells: list[dict], label: str | None) -> list[dict]:
    """The CoRP cells (method consolidate) of the label asked for, or of the only label there is."""
    corp = [c for c in cells if c["method"] == "consolidate"]
    labels = sorted({c["label"] for c in corp})
    if label is None and len(labels) > 1:
        raise SystemExit(f"several CoRP variants ({', '.join(labels)}): pass --corp LABEL")
    return [c for c in corp if label is None or c["label"] == label]


def find_row(cells: list[dict], report_row: str, prefer: dict | None) -> tuple[dict | None, dict | None]:
    """(row, its cell): the row named `report_row` on the CoRP cell's own population first, else any cell's."""
    for cell in ([prefer] if prefer else []) + cells:
        for r in cell["rows"]:
            # on the CoRP cell its RandOpt rows on its population; elsewhere a cell's own rows (a randopt cell's)
            mine = bool(r.get("population_row")) == (cell is prefer)
            if r["report_row"] == report_row and mine and r.get("correct") is not None:
                return r, cell
    return None, None


def seed_outcomes(cells: list[dict], corp: dict | None, vote_k: int) -> dict:
    """Per-example test outcomes of base, top-1, CoRP and vote@K in one seed, with the test ids they share."""
    found = {
        "base": find_row(cells, "base", None),
        "top1": find_row(cells, "randopt-top1", corp),
        "vote": find_row(cells, f"randopt-vote@{vote_k}", corp),
    }
    if corp is not None:
        own = [r for r in corp["rows"] if not r.get("population_row")]
        found["corp"] = (own[0], corp) if own else (None, None)
    ids = {tuple(c.get("example_ids") or ()) for r, c in found.values() if r is not None}
    if len(ids) > 1:
        raise SystemExit(f"seed {cells[0]['seed']}: the cells' test examples differ; they cannot be paired")
    out = {k: r["correct"] for k, (r, _) in found.items() if r is not None}
    out["abstained"] = corp is not None and "abstained" in found["corp"][0]["report_row"]
    if out["abstained"] and "base" in out:  # the gate kept the base: CoRP's deployed model is the base
        out["corp"] = out["base"]
    out["example_ids"] = list(next(iter(ids), ()))
    return out


# ----------------------------------------------------------------------------- across seeds


def t_stats(mean: float, se: float | None, df: float) -> dict:
    """A two-sided 95% t interval and p for an estimate with standard error `se` on `df` degrees of freedom."""
    if se is None or df < 1 or not math.isfinite(se):
        return {"mean": mean, "se": None, "df": df, "ci": None, "p": None}
    if se == 0:  # no spread: any nonzero value is certain (as stats.seed_example_interval decides)
        return {"mean": mean, "se": 0.0, "df": df, "ci": [mean, mean], "p": 0.0 if mean else 1.0}
    half = float(scipy_stats.t.ppf(0.975, df)) * se
    p = float(2 * scipy_stats.t.sf(abs(mean) / se, df))
    return {"mean": mean, "se": se, "df": df, "ci": [mean - half, mean + half], "p": p}


def over_seeds(values: list[float]) -> dict:
    """Mean of per-seed values with a t interval over seeds (k - 1 df); one seed: the value alone."""
    k = len(values)
    if k == 0:
        return {"mean": None, "n_seeds": 0}
    se = statistics.stdev(values) / math.sqrt(k) if k > 1 else None
    return {**t_stats(sum(values) / k, se, k - 1), "n_seeds": k}


def paired_over_seeds(a: list[list[int]], b: list[list[int]], ids: list[list[str]]) -> dict:
    """Mean test difference a - b over seeds: corp's crossed seeds x examples interval when the seeds share
    their test examples, else a t interval over per-seed differences; one seed: its paired bootstrap interval."""
    k = len(a)
    if k == 0:
        return {"mean": None, "n_seeds": 0}
    if k == 1:
        c = compare_paired("a", a[0], "b", b[0])
        return {"mean": c["difference"], "se": None, "df": 0, "ci": c["ci95"], "p": None, "n_seeds": 1}
    if all(i == ids[0] for i in ids):
        iv = seed_example_interval(a, b)
        return {**t_stats(iv["mean"], iv["se"], iv["df"]), "n_seeds": k, "per_seed": iv["seed_means"]}
    diffs = [sum(x) / len(x) - sum(y) / len(y) for x, y in zip(a, b)]
    return {**over_seeds(diffs), "per_seed": diffs}


def welch(a: dict, b: dict) -> dict:
    """a - b for two independent estimates (two models): se = sqrt(se_a^2 + se_b^2), Welch-Satterthwaite df."""
    if a.get("mean") is None or b.get("mean") is None:
        return {"mean": None, "p": None, "ci": None}
    mean = a["mean"] - b["mean"]
    if a.get("se") is None or b.get("se") is None:
        return t_stats(mean, None, 0)
    va, vb = a["se"] ** 2, b["se"] ** 2
    df = (va + vb) ** 2 / (va**2 / a["df"] + vb**2 / b["df"]) if va + vb > 0 else a["df"] + b["df"]
    return t_stats(mean, math.sqrt(va + vb), df)


def one_seed(cells: list[dict], corp: list[dict], margin: int, vote_k: int) -> dict:
    """Density and test outcomes of one model's seed; the per-seed gains over the base."""
    seed = int(cells[0]["seed"])
    if len(corp) > 1:
        raise SystemExit(f"seed {seed} has {len(corp)} CoRP cells (budgets or settings): keep one per results dir")
    with_pop = corp + [c for c in cells if c.get("population_run")]
    pop = population_dir(with_pop[0]) if with_pop else None
    dens = density(*support_rows(pop), margin) if pop else {"value": None, "missing": "no population run found"}
    out = seed_outcomes(cells, corp[0] if corp else None, vote_k)
    acc = {k: sum(v) / len(v) for k, v in out.items() if k in ("base", *GAINS)}
    gains = {k: acc[k] - acc["base"] for k in GAINS if k in acc and "base" in acc}
    row = {"seed": seed, "density": dens, "accuracy": acc, "gain": gains, "abstained": out["abstained"]}
    return {**row, "population_run": str(pop) if pop else None, "_outcomes": out}


def across(seeds: list[dict]) -> dict:
    """Each measure's mean and interval over the seeds that have it; CoRP - top-1 paired on the test examples."""
    out = {"density": over_seeds([s["density"]["value"] for s in seeds if s["density"]["value"] is not None])}
    pairs = {f"{g}_gain": (g, "base") for g in GAINS} | {"corp_minus_top1": ("corp", "top1")}
    for name, (a, b) in pairs.items():
        have = [s["_outcomes"] for s in seeds if a in s["_outcomes"] and b in s["_outcomes"]]
        out[name] = paired_over_seeds([h[a] for h in have], [h[b] for h in have], [h["example_ids"] for h in have])
    return out


def model_summary(
    dirs: list[Path], margin: int, corp_label: str | None, vote_k: int, budget=None, only: set[int] | None = None
) -> dict:
    """One model: its per-seed measures and their summaries across seeds ("no result yet" without cells);
    `only`: the seeds to read (the registration's; another study may run more seeds of the same config)."""
    cells = [c for c in at_budget(load_cells(dirs), budget) if only is None or int(c["seed"]) in only]
    if not cells:
        return {"dirs": [str(d) for d in dirs], "model": dirs[0].name, "params": None, "status": NO_RESULT}
    corp = pick_corp(cells, corp_label)
    seeds = []
    for seed in sorted({int(c["seed"]) for c in cells}):
        mine = [c for c in cells if int(c["seed"]) == seed]
        seeds.append(one_seed(mine, [c for c in corp if int(c["seed"]) == seed], margin, vote_k))
    pop = next((Path(s["population_run"]) for s in seeds if s["population_run"]), None)
    name, params = model_identity(pop, dirs)
    summary = across(seeds)
    for s in seeds:
        del s["_outcomes"]
    return {"dirs": [str(d) for d in dirs], "model": name, "params": params, "status": "ok", "seeds": seeds, **summary}


def primaries(models: list[dict]) -> list[dict]:
    """The plan's three registered primaries, largest model (L) against smallest (S), Holm-adjusted together."""
    done = sorted((m for m in models if m["status"] == "ok" and m["params"]), key=lambda m: m["params"])
    names = ["density(L) - density(S)", "[CoRP - top-1](L) - [CoRP - top-1](S)", "CoRP - base at L"]
    if len(done) < 2:
        tests = [{"mean": None, "p": None, "ci": None}] * 3
        small = large = None
    else:
        small, large = done[0], done[-1]
        tests = [
            welch(large["density"], small["density"]),
            welch(large["corp_minus_top1"], small["corp_minus_top1"]),
            large["corp_gain"],
        ]
    adjusted = holm([t.get("p") for t in tests])
    where = {"L": large["model"] if large else None, "S": small["model"] if small else None}
    return [{"primary": n, **where, **t, **h} for n, t, h in zip(names, tests, adjusted)]


# ----------------------------------------------------------------------------- outputs


def fmt(est: dict, pct: bool = False) -> str:
    """'+0.123 [+0.050, +0.196]', or the value alone, or a dash when there is none."""
    if est.get("mean") is None:
        return "-"
    scale, f = (100.0, "{:.1f}%") if pct else (1.0, "{:+.3f}")
    text = f.format(est["mean"] * scale)
    ci = est.get("ci")
    return text if not ci else f"{text} [{f.format(ci[0] * scale)}, {f.format(ci[1] * scale)}]"


def markdown(result: dict) -> str:
    """The per-model table, the per-seed table, the primaries and what could not be computed."""
    models = result["models"]
    if not any(m["status"] == "ok" for m in models):
        return "# The size claim\n\nNo result yet: no finished bench cells in the directories given.\n"
    lines = [
        "# The size claim: density of good specialists and test gains by model size",
        "",
        f"Density: share of specialists beating the base's support accuracy by >= {result['margin']} examples.",
        "Gains: test accuracy minus the base's, mean over seeds [95% interval].",
        "",
        "| model | params | seeds | density | top-1 gain | CoRP gain | vote gain | CoRP - top-1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in models:
        if m["status"] != "ok":
            lines.append(f"| {m['model']} | - | 0 | {NO_RESULT} | | | | |")
            continue
        cols = [fmt(m["density"], pct=True)] + [fmt(m[k]) for k in ("top1_gain", "corp_gain", "vote_gain")]
        params = f"{m['params']:.3g}" if m["params"] else "?"
        # a seed whose CoRP cell has not finished (only its base cell) has no measure yet: not counted
        done = sum(1 for x in m["seeds"] if x["gain"])
        seeds = f"{done}" + (f" (+{len(m['seeds']) - done} unfinished)" if done < len(m["seeds"]) else "")
        lines.append(f"| {m['model']} | {params} | {seeds} | {' | '.join(cols)} | {fmt(m['corp_minus_top1'])} |")
    lines += ["", "| model | seed | density | beats / n | top-1 gain | CoRP gain | vote gain | CoRP abstained |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for m in (m for m in models if m["status"] == "ok"):
        lines += [seed_line(m["model"], s) for s in m["seeds"]]
    lines += ["", "| primary (Holm over 3) | L | S | estimate [95%] | p | p (Holm) |", "|---|---|---|---|---|---|"]
    for p in result["primaries"]:
        ps = [f"{p[k]:.3g}" if p.get(k) is not None else "-" for k in ("p", "p_holm")]
        lines.append(f"| {p['primary']} | {p['L'] or '-'} | {p['S'] or '-'} | {fmt(p)} | {ps[0]} | {ps[1]} |")
    # by seed: a model whose first seeds are complete and whose next has only its base cell is missing one seed's density
    missing = [
        f"{m['model']} seed {s['seed']}: {s['density']['missing']}"
        for m in models
        for s in m.get("seeds", [])
        if s["density"].get("missing")
    ]
    return "\n".join(lines + ([""] + [f"Missing: {x}" for x in missing] if missing else [])) + "\n"


def seed_line(model: str, s: dict) -> str:
    d = s["density"]
    dens = f"{d['value']:.3f}" if d["value"] is not None else "-"
    counts = f"{d['beats']} / {d['n']}" if "beats" in d else "-"
    gains = [f"{s['gain'][k]:+.3f}" if k in s["gain"] else "-" for k in GAINS]
    return f"| {model} | {s['seed']} | {dens} | {counts} | {' | '.join(gains)} | {'yes' if s['abstained'] else 'no'} |"


def plot(result: dict, path: Path) -> bool:
    """Density and test gains against parameters (log x), the paper's densities beside; False without matplotlib
    or without a model that has results."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = sorted((m for m in result["models"] if m["status"] == "ok" and m["params"]), key=lambda m: m["params"])
    if not done:  # no result yet: nothing of ours to draw beside the paper's
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    series(left, done, "density", "corp (arith, this machine)")
    left.plot(*zip(*PAPER_DENSITY), "s--", color="grey", label=PAPER_LABEL)
    left.set(ylabel="density of good specialists", title=f"margin {result['margin']} support examples")
    for key, label in (("top1_gain", "RandOpt top-1"), ("corp_gain", "CoRP"), ("vote_gain", "vote@K")):
        series(right, done, key, label)
    right.axhline(0, color="black", lw=0.6)
    right.set(ylabel="test accuracy gain over base", title="test gains (mean over seeds, 95% interval)")
    # ticks at the sizes drawn (ours and the paper's), named as people name them: log-scale minor labels overlapped
    sizes = tick_sizes([m["params"] for m in done], [x for x, _ in PAPER_DENSITY])
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(sizes, [size_name(x) for x in sizes])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("parameters")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def tick_sizes(ours: list[float], theirs: list[float], apart: float = 1.3) -> list[float]:
    """The x ticks: our models' sizes, and the paper's where none of ours is within a factor `apart` (the
    1.5B model's 1.78e9 parameters and the paper's Qwen2.5-1.5B, 1.5e9, printed over each other)."""
    keep = [x for x in theirs if all(max(x, o) / min(x, o) >= apart for o in ours)]
    return sorted(set(ours) | set(keep))


def size_name(params: float) -> str:
    """135M, 1.5B: a parameter count as a tick label."""
    return f"{params / 1e9:.2g}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def series(ax, models: list[dict], key: str, label: str) -> None:
    """One measure's means with their intervals as error bars (models without it left out)."""
    pts = [(m["params"], m[key]) for m in models if m[key].get("mean") is not None]
    if not pts:
        return
    xs, ests = zip(*pts)
    ys = [e["mean"] for e in ests]
    err = [
        [y - (e["ci"] or [y, y])[0] for y, e in zip(ys, ests)],
        [(e["ci"] or [y, y])[1] - y for y, e in zip(ys, ests)],
    ]
    ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, label=label)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        nargs="+",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="one model's bench results directory, or one per seed (repeat --model per model)",
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for size_claim.json, .md and .png")
    ap.add_argument("--margin", type=int, default=4, help="support examples a specialist must beat the base by")
    ap.add_argument("--corp", default=None, help="the CoRP cells' label when the bench ran several variants")
    ap.add_argument("--vote-k", type=int, default=4, help="K of the RandOpt vote row (randopt-vote@K)")
    ap.add_argument("--budget", type=float, default=None, help="FLOPs budget of the cells read (default: the largest)")
    ap.add_argument("--seeds", default=None, help="read only these seeds, e.g. 0,1,2,3,4 (default: every seed found)")
    args = ap.parse_args(argv)
    only = {int(v) for v in args.seeds.split(",")} if args.seeds else None
    models = [model_summary(dirs, args.margin, args.corp, args.vote_k, args.budget, only) for dirs in args.model]
    result = {"margin": args.margin, "vote_k": args.vote_k, "models": models, "primaries": primaries(models)}
    args.out.mkdir(parents=True, exist_ok=True)
    result["plot"] = "size_claim.png" if models and plot(result, args.out / "size_claim.png") else None
    write_json(args.out / "size_claim.json", result)
    text = markdown(result)
    (args.out / "size_claim.md").write_text(text)
    print(text, end="")
    return result


if __name__ == "__main__":
    main()
