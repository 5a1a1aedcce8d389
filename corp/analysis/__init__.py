"""Analyses of a scored population: the split-half low-rank analysis (`corp analyze-rank`)."""
