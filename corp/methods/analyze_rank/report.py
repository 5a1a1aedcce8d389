"""Split-half low-rank analysis: the summary (per module, per layer, whole model), its printed
text, the CSV table and plots. `reproducible_ranks`, which reads the r* table back for low-rank
consolidation, is in the core module `corp/algorithms/lowrank.py`.

No algorithm here: the statistics and the rule are in `corp.methods.analyze_rank.rank_stats` (see its
docstring for the specification and its departures), the power simulation in `power`.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from corp.methods.analyze_rank.power import power_lines, power_sentence
from corp.runtime.runs import atomic_write_text, write_json


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return float(sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1)))


def summarise(result: dict, meta: dict, ranks: Sequence[int], significance: float) -> dict:
    mats = result["matrices"]
    n_mat = len(mats)
    with_rank = [m for m in mats if m["r_star"] > 0]
    hist: dict[str, int] = {}
    for m in mats:
        hist[str(m["r_star"])] = hist.get(str(m["r_star"]), 0) + 1

    def group(key):
        out: dict[str, dict] = {}
        for m in mats:
            k = "none" if m[key] is None else str(m[key])
            d = out.setdefault(k, {"n": 0, "with_rank": 0, "sum": 0})
            d["n"] += 1
            d["with_rank"] += m["r_star"] > 0
            d["sum"] += m["r_star"]
        return {
            k: {"n": d["n"], "fraction_with_rank": d["with_rank"] / d["n"], "mean_r_star": d["sum"] / d["n"]}
            for k, d in out.items()
        }

    def first_rank(stat):
        vals = [(m["rows"][0][stat], m["rows"][0][f"{stat}_null_mean"], m["rows"][0][f"{stat}_p"]) for m in mats]
        return {
            "rank": mats[0]["rows"][0]["rank"],
            "mean": float(np.mean([v[0] for v in vals])),
            "null_mean": float(np.mean([v[1] for v in vals])),
            "fraction_p_le_significance": float(np.mean([v[2] <= significance for v in vals])),
        }

    plan = result["plan"]
    return {
        **meta,
        "n_specialists": plan.n,
        "half_size": plan.n // 2,
        "weights": "z-scored rewards",
        "splits": len(plan.splits),
        "permutations": len(plan.perms) - 1,
        "significance": significance,
        "ranks": list(ranks),
        "rule": (
            "r* = largest grid rank r such that the marginal overlap beats its permutation null (p <= significance) "
            "at r and at every smaller grid rank; 0 if it fails at the first rank"
        ),
        "n_matrices": n_mat,
        "skipped_matrices": result["skipped"],
        "n_with_rank": len(with_rank),
        "fraction_with_rank": len(with_rank) / n_mat,
        "expected_fraction_under_null": significance,
        "binomial_p_vs_null": _binom_sf(len(with_rank), n_mat, significance),
        "r_star_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "r_star_cumulative_hist": {
            str(r): sum(m["r_star_cumulative"] == r for m in mats)
            for r in sorted({m["r_star_cumulative"] for m in mats})
        },
        "by_module": group("module"),
        "by_layer": group("layer"),
        "whole_model": {
            "overlap": first_rank("overlap"),
            "cos_raw": first_rank("cos_raw"),
            "cos_proj": first_rank("cos_proj"),
            "energy": first_rank("energy"),
        },
        "noise_draws": sum(m["noise_draws"] for m in mats),
        "streamed_matrices": [m["matrix"] for m in mats if not m["stacked"]],
        "seconds": result["seconds"],
        "r_star": {m["matrix"]: m["r_star"] for m in mats},
    }


def summary_text(s: dict) -> str:
    lines = [
        f"analyze-rank: {s['n_matrices']} weight matrices, N = {s['n_specialists']} specialists "
        f"(halves of {s['half_size']}), S = {s['splits']} splits, P = {s['permutations']} "
        f"permutations, significance level {s['significance']}, {s['seconds']:.0f} s",
        f"matrices with a reproducible rank r* > 0: {s['n_with_rank']}/{s['n_matrices']} "
        f"({100 * s['fraction_with_rank']:.1f}%; ~{100 * s['significance']:.0f}% "
        f"expected by chance, binomial p = {s['binomial_p_vs_null']:.3g})",
        "r* histogram: " + ", ".join(f"r*={k}: {v}" for k, v in s["r_star_hist"].items()),
    ]
    wm = s["whole_model"]
    for stat in ("overlap", "cos_raw", "energy"):
        d = wm[stat]
        lines.append(
            f"  mean {stat} at r={d['rank']}: {d['mean']:.4f} (null {d['null_mean']:.4f}); p <= {s['significance']} in "
            f"{100 * d['fraction_p_le_significance']:.0f}% of matrices"
        )
    lines.append(
        "by module: "
        + ", ".join(f"{k} {v['fraction_with_rank'] * v['n']:.0f}/{v['n']}" for k, v in s["by_module"].items())
    )
    power = s.get("power")
    if power:
        lines += power_lines(power)
    if s["n_with_rank"] == 0:
        verdict = "no reproducible low-rank structure: no matrix's split-half overlap beats the permutation null"
    elif s["binomial_p_vs_null"] > 0.05:
        verdict = "the matrices with r* > 0 are no more than chance predicts at this level: treat them as noise"
    else:
        verdict = ""
    if verdict:
        lines.append(verdict + ("; " + power_sentence(power) if power else " (power not simulated: --skip-power)"))
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    atomic_write_text(path, buf.getvalue())


def _savefig(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)


def plot_overlap(path: Path, mats: list[dict], k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = sorted(mats, key=lambda m: -m["r_star"])[: max(1, k // 2)]
    rest = [m for m in mats if m not in chosen]
    step = max(1, len(rest) // max(1, k - len(chosen)))
    chosen += rest[::step][: k - len(chosen)]
    fig, axes = plt.subplots(2, len(chosen), figsize=(3.6 * len(chosen), 6), squeeze=False)
    for j, m in enumerate(chosen):
        rs = [row["rank"] for row in m["rows"]]
        for i, (stat, label) in enumerate((("overlap", "overlap o_r"), ("marginal", "marginal overlap"))):
            ax = axes[i, j]
            obs = [row[stat] for row in m["rows"]]
            mean = [row[f"{stat}_null_mean"] for row in m["rows"]]
            p95 = [row[f"{stat}_null_p95"] for row in m["rows"]]
            ax.fill_between(rs, [0] * len(rs), p95, color="0.85", label="null (0 .. 95th pct)")
            ax.plot(rs, mean, color="0.5", ls="--", label="null mean")
            ax.plot(rs, obs, "o-", color="C0" if m["r_star"] == 0 else "C3", label="observed")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("rank r")
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(
                    f"{m['matrix'].replace('model.', '').replace('.weight', '')}\n{m['shape'][0]}x{m['shape'][1]}, "
                    f"r*={m['r_star']}",
                    fontsize=8,
                )
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def plot_heatmap(path: Path, mats: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layered = [m for m in mats if m["layer"] is not None]
    if not layered:
        return
    layers = sorted({m["layer"] for m in layered})
    modules = list(dict.fromkeys(m["module"] for m in layered))
    grid = np.full((len(layers), len(modules)), np.nan)
    for m in layered:
        grid[layers.index(m["layer"]), modules.index(m["module"])] = m["r_star"]
    fig, ax = plt.subplots(figsize=(1.1 * len(modules) + 2, 0.25 * len(layers) + 1.6))
    vmax = max(1.0, float(np.nanmax(grid)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
    ax.set_xticks(range(len(modules)), modules, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(layers)), [str(x) for x in layers], fontsize=6 if len(layers) > 16 else 8)
    ax.set_ylabel("layer")
    ax.set_title("reproducible rank r* (0 = none)", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def write_outputs(out_dir: Path, result: dict, summary: dict, plot_matrices: int = 4) -> None:
    mats = result["matrices"]
    write_csv(out_dir / "rank_analysis.csv", [row for m in mats for row in m["rows"]])
    write_json(out_dir / "rank_summary.json", summary)
    plot_overlap(out_dir / "rank_overlap.png", mats, plot_matrices)
    plot_heatmap(out_dir / "rank_heatmap.png", mats)
