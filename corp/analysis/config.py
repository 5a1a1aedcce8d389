"""Config of `corp analyze-rank` (kept apart from the algorithm so that the CLI imports no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from corp import CorpError
from corp.config import PopulationConfig, parse_list


@dataclass
class AnalyzeRankConfig(PopulationConfig):
    run: str | None = None
    """Run directory with a scored population (population.jsonl)"""
    ranks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    """Ranks r at which subspaces are compared, comma-separated."""
    splits: int = 10
    """S: random half-splits of the population, averaged."""
    permutations: int = 20
    """P: reward permutations for the null (each with the same S splits)."""
    alpha: float = 0.05
    """Level: a statistic beats the null when its permutation p-value is <= alpha."""
    analysis_seed: int = 0
    """Seed of the random splits, permutations and randomised SVDs."""
    include_embeddings: bool = False
    """Also analyse vocabulary matrices (embeddings, lm_head): slow, off by default."""
    matrices: str = ".*"
    """Regex: analyse only the weight matrices whose names match (e.g. a subset of layers)."""
    memory_mb: int = 1024
    """Memory budget (MB) for one matrix's stacked noise; bigger matrices stream the noise instead."""
    plot_matrices: int = 4
    """Matrices shown in rank_overlap.png."""

    def validate(self) -> "AnalyzeRankConfig":
        super().validate()
        self.ranks = sorted(set(parse_list(self.ranks, int, "ranks")))
        if not self.ranks or self.ranks[0] < 1:
            raise CorpError(f"--ranks must be integers >= 1, got {self.ranks}")
        if self.splits < 1:
            raise CorpError(f"--splits must be >= 1, got {self.splits}")
        if self.permutations < 1:
            raise CorpError(f"--permutations must be >= 1, got {self.permutations}")
        if not 0 < self.alpha < 1:
            raise CorpError(f"--alpha must be in (0, 1), got {self.alpha}")
        if 1 / (self.permutations + 1) > self.alpha:
            raise CorpError(f"--permutations {self.permutations}: the smallest permutation p-value is 1/{self.permutations + 1} > --alpha {self.alpha}, so nothing could pass; use >= {math.ceil(1 / self.alpha) - 1}")
        if self.memory_mb < 1:
            raise CorpError(f"--memory-mb must be >= 1, got {self.memory_mb}")
        if self.run is not None:
            if self.population_from:
                raise CorpError("give either --run or --population-from, not both")
            if not Path(self.run, "population.jsonl").exists():
                raise CorpError(f"--run '{self.run}' has no population.jsonl; score one first (corp score) or pass --model/--task/--population")
        return self
