"""Low-rank against full-rank specialists, from a finished noise-scheme bench (issue 26).

Reads what `corp bench --config configs/bench-noise.yaml` wrote (RESULTS/results.csv and
RESULTS/bench.json) and prints, as markdown, the three things its question needs side by side,
every figure computed from those files:

  1. test accuracy, mean ± sd over seeds, one row per method (RandOpt top-1, vote@K, CoRP) and one
     column per noise scheme (full, lowrank:r=R), with the noise scales each scheme's search chose
     on validation; the base's greedy row for reference;
  2. each configured comparison (low-rank minus full-rank, or against the base) with its across-seed
     95% interval and signs, and what it says: a loss is shown only where the interval lies below 0;
     otherwise the interval's lower end is the largest loss the seeds do not exclude;
  3. population scoring time per specialist under each scheme (the bench's own population files: the
     median over seeds of population_seconds / specialists for the RandOpt cells, which read the same
     prefix CoRP's do), one-thread figures from the bench's processes.

    python benchmarks/bench_noise_summary.py --results results/bench-noise [--out FILE] [--plot PNG]

`--plot` draws each low-rank − full-rank difference with its interval, one marker per method.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def _method(name: str) -> str | None:
    """'randopt-r4:randopt-vote@4' -> 'randopt-vote@4'; 'corp-r4' -> 'corp'; rows of no scheme -> None."""
    if ":" in name:
        return name.split(":", 1)[1]
    return "corp" if name.startswith("corp-") else None


def _scheme_order(s: str) -> tuple[int, int]:
    return (0, 0) if s == "full" else (1, -int(s.rsplit("=", 1)[1]))  # full, then rank high to low


def _read(results: Path) -> tuple[list[dict], dict, float]:
    """results.csv's rows, bench.json, and the top budget, which both the summary and the plot read."""
    bench = json.loads((results / "bench.json").read_text())
    return list(csv.DictReader((results / "results.csv").open())), bench, max(bench["budgets"])


def summary(results: Path) -> str:
    rows, bench, top = _read(results)
    # a CoRP cell whose gate kept the base is 'abstained (= base)': the base is the model it returns, so
    # its accuracy counts like any other seed's (the bench's comparisons count it too), and is flagged
    rows = [r for r in rows if r["status"] == "done" or r["status"].startswith("abstained")]
    # the base and the references have no budget (an empty cell): they stand beside every budget
    rows = [r for r in rows if r["accuracy"] and (not r["budget"] or float(r["budget"]) == top)]
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    scales: dict[tuple[str, str], set[str]] = defaultdict(set)
    per_spec: dict[str, list[float]] = defaultdict(list)
    abstained: dict[tuple[str, str], int] = defaultdict(int)
    base = [float(r["accuracy"]) for r in rows if r["method"] == "base"]
    for r in rows:
        m = _method(r["method"])
        if m is None:
            continue
        hp = json.loads(r["hyperparameters"] or "{}")
        s = hp.get("noise", "full")
        acc[m, s].append(float(r["accuracy"]))
        abstained[m, s] += r["status"].startswith("abstained")
        scales[m, s].add(",".join(f"{x:g}" for x in hp.get("from_sigmas") or hp.get("sigmas") or []))
        if m == "randopt-top1" and r["population_seconds"] and r["units"]:
            per_spec[s].append(float(r["population_seconds"]) / float(r["units"]))
    if not acc:
        return f"No final cell of a noise scheme at {top:.2g} FLOPs in {results} yet.\n"
    schemes = sorted({s for _, s in acc}, key=_scheme_order)
    methods = sorted({m for m, _ in acc}, key=lambda m: (m == "corp", m))
    out = [
        f"Test accuracy at {top:.2g} FLOPs, mean ± sd over seeds (k seeds); the noise scales chosen on validation:",
        "",
    ]
    out += ["| method | " + " | ".join(schemes) + " |", "|---|" + "---:|" * len(schemes)]
    for m in methods:
        cells = []
        for s in schemes:
            got = acc.get((m, s), [])
            if not got:
                cells.append("not run")
                continue
            sd = statistics.stdev(got) if len(got) > 1 else 0.0
            kept = f"; {abstained[m, s]} abstained (= base)" if abstained[m, s] else ""
            sig = "/".join(sorted(scales[m, s]))
            cells.append(f"{statistics.fmean(got):.3f} ± {sd:.3f} ({len(got)}{kept}; σ {sig})")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    if base:
        out += ["", f"Base (greedy): {statistics.fmean(base):.3f}."]
    out += ["", "| comparison | difference | 95% interval | signs | reading |", "|---|---:|---|---|---|"]
    for c in bench["comparisons"]:
        if float(c["budget"]) != top:
            continue
        lo, hi = c["ci95"]
        k = c.get("n_seeds", 1)
        signs = c.get("signs", {})
        sign = f"{signs.get('+', 0)}+ {signs.get('-', 0)}- {signs.get('0', 0)}= of {k}"
        if k < 2:
            reading = "one seed: no claim"
        elif hi < 0:
            reading = f"{c['a']} is worse"
        elif lo > 0:
            reading = f"{c['a']} is better"
        else:
            reading = f"no difference shown; a loss larger than {-lo:.3f} is excluded"
        out.append(f"| {c['a']} − {c['b']} | {c['difference']:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {sign} | {reading} |")
    if per_spec:
        out += ["", "Population scoring, seconds per specialist (median over seeds, one thread):", ""]
        out += ["| scheme | s / specialist | against full |", "|---|---:|---:|"]
        ref = statistics.median(per_spec["full"]) if per_spec.get("full") else None
        for s in sorted(per_spec, key=_scheme_order):
            med = statistics.median(per_spec[s])
            ratio = f"{ref / med:.2f}x the specialists/hour" if ref else ""
            out.append(f"| {s} | {med:.2f} | {ratio} |")
    return "\n".join(out) + "\n"


def plot(results: Path, out: Path) -> int:
    """Each low-rank scheme minus full rank, per method, with the bench's 95% interval: the question
    read at a glance (an interval wholly below 0 is a loss). Returns how many intervals it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, bench, top = _read(results)
    scheme = {}  # a method's row name -> its noise scheme, from results.csv
    for r in rows:
        if r["hyperparameters"]:
            scheme[r["method"]] = json.loads(r["hyperparameters"]).get("noise", "full")
    pts = defaultdict(list)  # method -> [(scheme, difference, lo, hi, k)]
    for c in bench["comparisons"]:
        sa, sb = scheme.get(c["a"]), scheme.get(c["b"])
        same = _method(c["a"]) is not None and _method(c["a"]) == _method(c["b"])  # not "against the base"
        if float(c["budget"]) != top or not same or sb != "full" or sa in (None, "full"):
            continue
        pts[_method(c["a"])].append((sa, c["difference"], *c["ci95"], c.get("n_seeds", 1)))
    schemes = sorted({p[0] for v in pts.values() for p in v}, key=_scheme_order)
    if not schemes:
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(pts), 1)
    for i, (m, got) in enumerate(sorted(pts.items())):
        xs = [schemes.index(g[0]) - 0.4 + width * (i + 0.5) for g in got]
        ys = [g[1] for g in got]
        err = [[g[1] - g[2] for g in got], [g[3] - g[1] for g in got]]
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=4, label=m)
    ax.axhline(0, color="grey", lw=1, ls="--")
    ax.set_xticks(range(len(schemes)), schemes)
    k = sorted({g[4] for v in pts.values() for g in v})
    ax.set_ylabel("test accuracy, low rank − full rank")
    ax.set_title(f"{results.name}, {top:.2g} FLOPs: 95% interval over {'/'.join(map(str, k))} seeds", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return sum(len(v) for v in pts.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/bench-noise"), help="the bench's results directory")
    ap.add_argument("--out", type=Path, help="write the markdown here (default: standard output)")
    ap.add_argument("--plot", type=Path, help="also draw each low-rank − full-rank difference with its interval (PNG)")
    a = ap.parse_args(argv)
    missing = [f for f in ("results.csv", "bench.json") if not (a.results / f).is_file()]
    if missing:
        print(
            f"bench_noise_summary: {a.results} has no {', '.join(missing)}; run "
            "`corp bench --config configs/bench-noise.yaml --report-only` first",
            file=sys.stderr,
        )
        return 2
    text = summary(a.results)
    if a.plot:
        plot(a.results, a.plot)
    if a.out:
        a.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
