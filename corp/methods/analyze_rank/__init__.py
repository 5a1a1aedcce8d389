"""Analyses of a scored population: the split-half low-rank analysis (`corp analyze-rank`).

Layers, lowest first: `linalg` (SVD helpers), `rank_stats` (the statistics and the r* rule),
`power` (what the rule could find at this N), `report` (summary, text, tables, plots),
`split_half` (the command). What low-rank consolidation shares with the analysis (`low_rank_factors`,
`project_low_rank`, `reproducible_ranks`) is in the core module `corp/algorithms/lowrank.py`: algorithm
packages never import each other (tests/test_layers.py).

The names below are this package's public surface: code outside `corp.methods.analyze_rank` imports them from
here (`from corp.methods.analyze_rank import run_analyze_rank`), never from a submodule (tests/test_layers.py).
"""

from corp.method import SMALL, Method
from corp.methods.analyze_rank.config import NAME, AnalyzeRankConfig
from corp.methods.analyze_rank.split_half import run_analyze_rank


def summary(report: dict) -> str:
    return "\n".join(
        [
            report.get("text") or report.get("table") or "",
            "wrote rank_analysis.csv, rank_summary.json, "
            f"rank_overlap.png, rank_heatmap.png in {report.get('run_dir')}",
        ]
    )


METHOD = Method(
    NAME,
    AnalyzeRankConfig,
    run_analyze_rank,
    "Split-half low-rank analysis of a scored population (--from-run DIR, or --model/--task/--population to score "
    "first): reproducible rank r* per weight matrix.",
    report="rank_summary.json",
    smoke={
        **SMALL,
        "population": 4,
        "sigmas": "0.05",
        "ranks": "1,2",
        "splits": 2,
        "permutations": 19,
        "power_sims": 4,
    },
    summary=summary,
)

__all__ = ["METHOD", "AnalyzeRankConfig", "run_analyze_rank"]
