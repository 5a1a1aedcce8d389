"""The `corp consolidate` command's config (arXiv 2605.31494; docs/methods.md "CoRP").

`ConsolidateConfig` is a population run plus the CoRP operator (`OperatorConfig`, in the core
package `corp/algorithms/corp_operator/config.py`) plus low-rank consolidation and reporting options.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from corp.algorithms.corp_operator.config import OperatorConfig
from corp.algorithms.corp_operator.gate import MIN_PROBE, MIN_VALIDATION
from corp.algorithms.perturb import lowrank_rank, scheme_from_flag
from corp.config import DEFAULT_TOP_K, PopulationConfig, fit_top_k
from corp.errors import CorpError
from corp.methods.consolidate.lowrank import parse_low_rank

# CoRP's names, each written here once: the command (`corp consolidate`, the report's and the bench
# records' method) and what it makes (its report row and report section, its recipe's made_by.method,
# its Python function corp.train_corp)
COMMAND = "consolidate"
PRODUCT = "corp"


@dataclass
class ConsolidateConfig(OperatorConfig, PopulationConfig):
    top_k: list[int] = field(default_factory=lambda: list(DEFAULT_TOP_K))
    """RandOpt ensemble sizes K reported beside CoRP, comma-separated; the default's values above --population become --population."""
    low_rank: str = "off"
    """Low-rank consolidation (ours): off; auto (each matrix's block of m2 projected on its top-r* subspace, r* from `corp analyze-rank`; unanalysed parameters get no update); or an integer R (every 2-D matrix rank R, 1-D none)."""
    rank_from: str | None = None
    """Run directory whose analyze-rank output gives r* for --low-rank auto (default: --from-run, else this run)."""
    export_lora: bool = False
    """Also write the low-rank update as a PEFT LoRA adapter to RUN_DIR/lora/ (needs --low-rank auto or R, or a
    low-rank population: --noise lowrank:r=R with --low-rank off exports CoRP's update exactly, rank <= K*R)."""
    lora_rank: int = 0
    """With --export-lora on a low-rank population (--low-rank off): also write an SVD-compressed adapter of this
    rank to RUN_DIR/lora-rank-R/ and report its relative Frobenius error (0: none)."""

    # the rank of a LoRA adapter is `lora_r` (TRL's and PEFT's name), as grpo's
    options: ClassVar[dict[str, str]] = {"lora_rank": "lora_r"}

    def validate(self) -> ConsolidateConfig:
        PopulationConfig.validate(self)
        OperatorConfig.validate(self)
        self.top_k = fit_top_k(self.top_k, self.population)

        self.low_rank = parse_low_rank(self.low_rank)
        if self.low_rank != "off" and self.rounds > 0:
            raise CorpError(
                f"--low-rank {self.low_rank} cannot be combined with --stage2-rounds "
                f"{self.rounds}: stage-2 re-centring is full-rank; use --stage2-rounds 0"
            )

        lowrank_population = lowrank_rank(scheme_from_flag(self.noise)) is not None
        if self.export_lora and self.low_rank == "off" and not lowrank_population:
            raise CorpError(
                "--export-lora needs a low-rank update: add --low-rank auto or --low-rank R, "
                "or score a low-rank population (--noise lowrank:r=R)"
            )
        if self.lora_rank < 0:
            raise CorpError(f"--lora-r must be >= 1 (or 0 for none), got {self.lora_rank}")
        if self.lora_rank and not (self.export_lora and self.low_rank == "off" and lowrank_population):
            raise CorpError(
                "--lora-r compresses the exact adapter of a low-rank population: "
                "it needs --export-lora and --noise lowrank:r=R with --low-rank off"
            )
        if self.rank_from is not None and self.low_rank != "auto":
            raise CorpError("--rank-from only applies to --low-rank auto")
        if self.rank_from is not None and not Path(self.rank_from).is_dir():
            raise CorpError(f"--rank-from '{self.rank_from}' is not a directory")
        if self.n_validation < MIN_VALIDATION:
            warnings.warn(
                f"--n-validation {self.n_validation} is too small for "
                f"the gate to mean much; use at least {MIN_VALIDATION}"
            )
        if self.n_probe < MIN_PROBE:
            warnings.warn(
                f"--n-probe {self.n_probe} is too small to choose a step size reliably; use at least {MIN_PROBE}"
            )
        return self
