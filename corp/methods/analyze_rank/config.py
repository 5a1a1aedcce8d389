"""Config of `corp analyze-rank` (kept apart from the algorithm so that the CLI imports no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from corp.config import PopulationConfig, parse_list
from corp.errors import CorpError

NAME = "analyze-rank"  # the command, the run's method and its progress lines' name


@dataclass
class AnalyzeRankConfig(PopulationConfig):
    from_run: str | None = None
    """Analyse the scored population of this run directory and write the analysis into it (into --output-dir if given)."""
    ranks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    """Ranks r at which subspaces are compared, comma-separated."""
    splits: int = 10
    """S: random half-splits of the population, averaged."""
    permutations: int = 20
    """P: reward permutations for the null (each with the same S splits)."""
    significance: float = 0.05
    """Level: a statistic beats the null when its permutation p-value is <= this level."""
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
    power_sims: int = 32
    """Simulated populations per planted strength for the power estimate (the smallest planted signal found with probability 0.8 at this N and these matrix shapes); 0 skips it."""
    skip_power: bool = False
    """Skip the power simulation (rank_summary.json then has no `power` block)."""
    power_rank: int = 1
    """Rank of the planted signal in the power simulation."""

    # --from-run (PopulationConfig) names the population; without --output-dir the analysis is written
    # into that run, where `corp consolidate --from-run DIR --low-rank auto` finds it
    renamed: ClassVar[dict[str, str]] = {"run": "from_run", "alpha": "significance"}

    @property
    def run(self) -> str | None:
        """The run analysed in place: --from-run, unless --output-dir names another directory."""
        if self.from_run and (self.run_dir is None or Path(self.run_dir).resolve() == Path(self.from_run).resolve()):
            return self.from_run
        return None

    @property
    def alpha(self) -> float:
        """Deprecated alias of `significance`."""
        return self.significance

    def validate(self) -> AnalyzeRankConfig:
        self.ranks = sorted(set(parse_list(self.ranks, int, "ranks")))
        if not self.ranks or self.ranks[0] < 1:
            raise CorpError(f"--ranks must be integers >= 1, got {self.ranks}")
        if self.splits < 1:
            raise CorpError(f"--splits must be >= 1, got {self.splits}")
        if self.permutations < 1:
            raise CorpError(f"--permutations must be >= 1, got {self.permutations}")
        if not 0 < self.significance < 1:
            raise CorpError(f"--significance must be in (0, 1), got {self.significance}")
        if 1 / (self.permutations + 1) > self.significance:
            raise CorpError(
                f"--permutations {self.permutations}: the smallest permutation p-value "
                f"is 1/{self.permutations + 1} > --significance {self.significance}, "
                f"so nothing could pass; use >= {math.ceil(1 / self.significance) - 1}"
            )
        if self.power_sims < 0:
            raise CorpError(f"--power-sims must be >= 0 (0 skips the power simulation), got {self.power_sims}")
        if self.power_rank < 1:
            raise CorpError(f"--power-rank must be >= 1, got {self.power_rank}")
        if self.memory_mb < 1:
            raise CorpError(f"--memory-mb must be >= 1, got {self.memory_mb}")
        super().validate()  # after the checks above: they need no file system
        return self
