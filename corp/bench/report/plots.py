"""The bench's plot: accuracy against FLOPs per task and setting, each method's curve over the budgets."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from corp.bench.config import (
    BenchConfig,
    at_budget,
    budget_text,
    file_part,
    save_plot,
)
from corp.bench.report.rows import LABEL_PRIOR, mean_sd
from corp.methods import consolidate, randopt, self_consistency


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
            made.append(_flops_plot(plt, cfg, sub, out, task, setting))
            made.append(_passes_plot(plt, cfg, rows, out, task, setting))
    return made


def _flops_plot(plt, cfg: BenchConfig, sub: list[dict], out: Path, task: str, setting: str) -> str:
    """Accuracy against FLOPs for one task and setting: each method's curve over the budgets."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(dict.fromkeys(r["method"] for r in sub))
    xs = []
    for name in names:
        xs += _method_curve(ax, cfg, name, [r for r in sub if r["method"] == name])
    ax.set_xscale("log")
    _narrow_log_ticks(ax, xs)
    ax.set_xlabel("training / selection FLOPs actually used (mean over seeds)")
    ax.set_ylabel("test accuracy (mean ± sd over seeds)")
    ax.set_title(f"{cfg.name}: {cfg.label(task)}, {setting}")
    ax.legend(fontsize=7, loc="best")
    return save_plot(fig, out, f"accuracy_vs_flops__{file_part(cfg.label(task))}__{setting}.png")


def _narrow_log_ticks(ax, xs: list[float]) -> None:
    """Plain ticks where the points span under 0.4 of a decade (one budget, methods spending slightly
    different FLOPs): there matplotlib labels every minor tick as 'a x 10^b' and the labels run into each
    other. Ticks then sit at the lowest and the highest point, with as many digits as tell them apart."""
    from matplotlib.ticker import NullFormatter

    if not xs or math.log10(max(xs) / min(xs)) >= 0.4:
        return
    lo, hi = min(xs), max(xs)
    digits = next((d for d in range(2, 7) if f"{lo:.{d}g}" != f"{hi:.{d}g}"), 2)
    ticks = sorted({lo, hi})
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [f"{t:.{digits}g}" for t in ticks])
    if lo == hi:  # one point: give it room on both sides
        ax.set_xlim(lo / 1.2, hi * 1.2)


def _method_curve(ax, cfg: BenchConfig, name: str, mine: list[dict]) -> list[float]:
    """One method's rows on the FLOPs plot: a curve over the budgets, or a horizontal line without training.
    Returns the FLOPs it plotted at."""
    if all(r["budget"] is None for r in mine):  # no training compute: a horizontal reference line
        m, sd = mean_sd([r["accuracy"] for r in mine])
        if name == LABEL_PRIOR:
            ax.axhline(m, ls=":", lw=1, color="black", label=f"{name} (label prior, no model)")
        elif name == "base" or mine[0]["passes_per_example"] == 1:
            ax.axhline(m, ls="--", lw=1, color="grey" if name == "base" else None, label=f"{name} (no training)")
        return []
    xs, ys, es = [], [], []
    for b in cfg.budgets:
        got = [r for r in mine if r["budget"] == b]
        if got:
            xs.append(statistics.fmean([g["flops"] for g in got]))
            m, sd = mean_sd([g["accuracy"] for g in got])
            ys.append(m)
            es.append(sd)
    if xs:
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)
    return xs


# the families of the passes plot, by row name (rows are named after their method, CoRP's after what it
# makes): RandOpt K-vote and self-consistency@K, CoRP at 1
PASS_FAMILIES = (
    ("RandOpt K-vote", lambda n: n.startswith(randopt.NAME)),
    ("self-consistency@K", lambda n: n.startswith(self_consistency.NAME)),
    ("CoRP", lambda n: n.startswith(consolidate.PRODUCT) and "/" not in n),  # not RandOpt on CoRP's population
)


def _passes_plot(plt, cfg: BenchConfig, rows: list[dict], out: Path, task: str, setting: str) -> str:
    """Accuracy against inference passes per example at the largest budget, one curve per family."""
    top = cfg.budgets[-1]
    by = at_budget(rows, task, setting, top)
    fig, ax = plt.subplots(figsize=(6, 4))
    for family, test in PASS_FAMILIES:
        _family_points(ax, family, test, by)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("inference passes per test example")
    ax.set_ylabel("test accuracy (mean ± sd over seeds)")
    ax.set_title(f"{cfg.label(task)}, {setting}, budget {budget_text(top)} FLOPs")
    ax.legend(fontsize=7, loc="best")
    return save_plot(fig, out, f"accuracy_vs_passes__{file_part(cfg.label(task))}__{setting}.png")


def _family_points(ax, family: str, test, by: dict) -> None:
    """One family's rows on the passes plot: a curve over K, or CoRP's single-pass rows as stars."""
    pts = {}
    for n, got in by.items():
        if test(n):
            pts.setdefault(got[0]["passes_per_example"], []).append((n, mean_sd([g["accuracy"] for g in got])))
    if not pts:
        return
    if family == "CoRP":
        for n, (m, sd) in pts.get(1, []):
            ax.errorbar([1], [m], yerr=[sd], marker="*", ms=10, capsize=3, ls="none", label=n)
        return
    ks = sorted(pts)
    ax.errorbar(
        ks,
        [pts[k][0][1][0] for k in ks],
        yerr=[pts[k][0][1][1] for k in ks],
        marker="o",
        capsize=3,
        label=family,
    )
