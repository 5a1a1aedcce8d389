"""Analyses of a scored population: the split-half low-rank analysis (`corp analyze-rank`).

Layers, lowest first: `linalg` (SVD and low-rank helpers, shared with low-rank consolidation),
`rank_stats` (the statistics and the r* rule), `power` (what the rule could find at this N),
`report` (summary, text, tables, plots, `reproducible_ranks`), `split_half` (the command).

The names below are this package's public surface: code outside `corp.analysis` imports them from
here (`from corp.analysis import low_rank_factors`), never from a submodule (tests/test_layers.py).
"""

from corp.analysis.config import AnalyzeRankConfig
from corp.analysis.linalg import low_rank_factors
from corp.analysis.report import reproducible_ranks
from corp.analysis.split_half import run_analyze_rank

__all__ = ["AnalyzeRankConfig", "low_rank_factors", "reproducible_ranks", "run_analyze_rank"]
