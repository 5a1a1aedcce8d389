"""The CoRP operator's config (arXiv 2605.31494; docs/methods.md "CoRP").

`OperatorConfig` is everything stage 1 and stage 2 of the operator read (grids, merge rules,
compatibility mode, gate, re-centring rounds). The commands that run the operator add their own
options by subclassing it: `ConsolidateConfig` (`corp/methods/consolidate/config.py`) and `FedCorpConfig`
(`corp/methods/fedcorp/run.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from corp.algorithms.corp_operator.gate import confidence_level
from corp.algorithms.corp_operator.merge_rules import MERGE_RULES
from corp.config import flag, parse_list
from corp.errors import CorpError
from corp.grids import edge_flag

PAPER_PRESET = {
    "quantiles": [0.5, 0.7, 0.9],
    "betas": [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0],
    "alphas": [0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
}

STEP_GRIDS = (("alpha", "alphas"), ("q", "quantiles"), ("beta", "betas"))  # a candidate's value, the grid searched


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
    """Merge rules to search (corp/algorithms/corp_operator/merge_rules), comma-separated: the first is deployed if its gate passes; the others are searched and gated for the report."""
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
    """Memory budget for the exact Gram matrix's column pieces of noise (every elite's, fp32 and fp64), per worker thread (tensors are built in parallel, one worker per torch thread); each elite's noise is drawn once whatever the budget."""
    merge_memory_gb: float = 4.0
    """Step search: memory for merged directions built together (one fp32 copy of the perturbed weights each); directions built together generate each elite's noise once."""

    # `--stage2-rounds` is a federated command's communication rounds (fgrpo, fera); here they are stage 2's
    options: ClassVar[dict[str, str]] = {"rounds": "stage2_rounds"}

    def validate(self) -> OperatorConfig:

        if self.preset not in (None, "", "paper"):
            raise CorpError(f"--preset '{self.preset}' is unknown; the only preset is 'paper'")
        if self.preset == "paper":
            self.quantiles, self.betas, self.alphas = (list(PAPER_PRESET[k]) for k in ("quantiles", "betas", "alphas"))
        self.quantiles = parse_list(self.quantiles, float, "quantiles")
        self.betas = parse_list(self.betas, float, "betas")
        self.alphas = parse_list(self.alphas, float, "alphas")
        self.merge_rules = [r.strip() for r in parse_list(self.merge_rules, str, "merge_rules")]
        self._check_grids()
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

    def _check_grids(self) -> None:
        """The searched grids (--quantiles, --betas, --alphas): each value in its range, none dropped silently."""
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

    def edge_flags(self, params: dict) -> list[dict]:
        """report.json's flags for a candidate's alpha, q and beta (`Candidate.params`) on the edge of the grid
        searched (corp.grids): the best step may lie beyond it."""
        found = (
            edge_flag(name, params[name], getattr(self, grid), flag(grid, type(self))) for name, grid in STEP_GRIDS
        )
        return [f for f in found if f]

    @property
    def gate_confidence(self) -> float:
        """Phi(gate_z): the one-sided confidence level of the gates' lower bound."""
        return confidence_level(self.gate_z)
