"""Analyses of a scored population: the split-half low-rank analysis (`corp analyze-rank`).

Layers, lowest first: `linalg` (SVD helpers), `rank_stats` (the statistics and the r* rule),
`power` (what the rule could find at this N), `report` (summary, text, tables, plots),
`split_half` (the command). What low-rank consolidation shares with the analysis (`low_rank_factors`,
`project_low_rank`, `reproducible_ranks`) is in the core module `corp/lowrank.py`: algorithm
packages never import each other (tests/test_layers.py).

The names below are this package's public surface: code outside `corp.analysis` imports them from
here (`from corp.analysis import run_analyze_rank`), never from a submodule (tests/test_layers.py).
"""

from corp.analysis.config import AnalyzeRankConfig
from corp.analysis.split_half import run_analyze_rank

__all__ = ["AnalyzeRankConfig", "run_analyze_rank"]
