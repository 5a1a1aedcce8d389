"""Analyses of a scored population: the split-half low-rank analysis (`corp analyze-rank`).

Layers, lowest first: `linalg` (SVD and low-rank helpers, shared with low-rank consolidation),
`rank_stats` (the statistics and the r* rule), `power` (what the rule could find at this N),
`report` (summary, text, tables, plots, `reproducible_ranks`), `split_half` (the command).
"""
