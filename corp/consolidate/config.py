"""Configs of CoRP consolidation (arXiv 2605.31494; docs/methods.md "CoRP").

`OperatorConfig` is everything stage 1 and stage 2 of the operator read (grids, merge rules,
compatibility mode, gate, re-centring rounds); `ConsolidateConfig` is the `corp consolidate`
command: a population run plus the operator plus low-rank consolidation and reporting options.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from corp import CorpError
from corp.config import DEFAULT_TOP_K, PopulationConfig, fit_top_k, parse_list
from corp.consolidate.gate import MIN_PROBE, MIN_VALIDATION, confidence_level

PAPER_PRESET = {
    "quantiles": [0.5, 0.7, 0.9],
    "betas": [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0],
    "alphas": [0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
}


@dataclass
class OperatorConfig:
    """What CoRP's stage 1 and stage 2 read (one object instead of a parameter per knob)."""

    quantiles: list[float] = field(default_factory=lambda: [0.5])
    """Elite quantiles q to search (elite = reward >= q-quantile), comma-separated."""
    betas: list[float] = field(default_factory=lambda: [10.0])
    """Softmax inverse temperatures beta on rewards to search, comma-separated (beta acts on the raw rewards)."""
    alphas: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    """Step sizes alpha (update = alpha * m2) to search on the probe split, comma-separated."""
    preset: str | None = None
    """'paper': the paper's grids for q, beta and alpha (overrides the three lists above)."""
    merge_rules: list[str] = field(default_factory=lambda: ["pass2", "pass1"])
    """Merge rules to search (corp/consolidate/merge_rules), comma-separated: the first is deployed if its gate passes; the others are searched and gated for the report."""
    compat: str = "exact"
    """Compatibility terms: 'exact' (weight-space Gram matrix, fp64) or 'seed-orthogonal' (cheap)."""
    gate_z: float = 1.0
    """z of the gates' one-sided lower confidence bound (accept if mean - z sd / sqrt(n) > 0): z = 1 is a one-sided 84% bound, so a candidate with no real gain passes about 1 time in 6; 1.645 is 95%."""
    rounds: int = 0
    """Stage-2 re-centring rounds (0 = stage 1 only)."""
    local_population: int = 16
    """Stage 2: specialists sampled around the centre per round."""
    pcs: int = 2
    """Stage 2: principal directions of the elite cloud mixed into the local noise."""
    pc_mix: float = 0.5
    """Stage 2: share of the local noise variance along the principal directions (0..1)."""
    gram_memory_gb: float = 2.0
    """Memory budget for the stacked noise used to build the exact Gram matrix, per worker thread (tensors are built in parallel, one worker per torch thread)."""
    merge_memory_gb: float = 4.0
    """Step search: memory for merged directions built together (one fp32 copy of the perturbed weights each); directions built together generate each elite's noise once."""

    # `--stage2-rounds` is a federated command's communication rounds (fgrpo, fera); here they are stage 2's
    options: ClassVar[dict[str, str]] = {"rounds": "stage2_rounds"}

    def validate(self) -> OperatorConfig:
        from corp.consolidate.merge_rules import MERGE_RULES

        if self.preset not in (None, "", "paper"):
            raise CorpError(f"--preset '{self.preset}' is unknown; the only preset is 'paper'")
        if self.preset == "paper":
            self.quantiles, self.betas, self.alphas = (list(PAPER_PRESET[k]) for k in ("quantiles", "betas", "alphas"))
        self.quantiles = parse_list(self.quantiles, float, "quantiles")
        self.betas = parse_list(self.betas, float, "betas")
        self.alphas = parse_list(self.alphas, float, "alphas")
        self.merge_rules = [r.strip() for r in parse_list(self.merge_rules, str, "merge_rules")]
        for name, values, ok, rule in (
            ("quantiles", self.quantiles, lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
            ("betas", self.betas, lambda v: v >= 0 and math.isfinite(v), ">= 0"),
            ("alphas", self.alphas, lambda v: v > 0 and math.isfinite(v), "> 0"),
        ):
            valid = [v for v in values if ok(v)]
            if not valid:
                raise CorpError(f"--{name} has no valid value (each must be {rule}); got {values}")
            if len(valid) < len(values):
                raise CorpError(f"--{name} value(s) {[v for v in values if not ok(v)]} are not {rule}")
        unknown = [r for r in self.merge_rules if r not in MERGE_RULES]
        if not self.merge_rules or unknown or len(set(self.merge_rules)) < len(self.merge_rules):
            raise CorpError(
                f"--merge-rules must list distinct registered rules ({', '.join(MERGE_RULES)}); got {self.merge_rules}"
            )
        if self.compat not in ("exact", "seed-orthogonal"):
            raise CorpError(f"--compat must be 'exact' or 'seed-orthogonal', got '{self.compat}'")
        if not (self.merge_memory_gb > 0 and self.gram_memory_gb > 0):
            raise CorpError(
                "--merge-memory-gb and --gram-memory-gb must be > 0, "
                f"got {self.merge_memory_gb} and {self.gram_memory_gb}"
            )
        if not math.isfinite(self.gate_z):
            raise CorpError(f"--gate-z must be a finite number, got {self.gate_z}")
        if self.rounds < 0 or self.local_population < 2 or self.pcs < 0 or not 0.0 <= self.pc_mix <= 1.0:
            raise CorpError("need --stage2-rounds >= 0, --local-population >= 2, --pcs >= 0 and 0 <= --pc-mix <= 1")
        return self

    @property
    def gate_confidence(self) -> float:
        """Phi(gate_z): the one-sided confidence level of the gates' lower bound."""
        return confidence_level(self.gate_z)


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
        from corp.consolidate.lowrank import parse_low_rank

        self.low_rank = parse_low_rank(self.low_rank)
        if self.low_rank != "off" and self.rounds > 0:
            raise CorpError(
                f"--low-rank {self.low_rank} cannot be combined with --stage2-rounds "
                f"{self.rounds}: stage-2 re-centring is full-rank; use --stage2-rounds 0"
            )
        from corp.perturb import lowrank_rank, scheme_from_flag

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
