"""F-TIS's options: GRPO's, less those it does not have (refused unless at their default), plus its
nodes, truncation cap and KL filter."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from corp.algorithms.grpo.trainer import (
    GRPOConfig,
)
from corp.config import flag
from corp.errors import CorpError

NAME = "ftis"  # the command, the report's method, its trained arm and its rows (node<K>-ftis)

# GRPO options F-TIS does not have, each refused unless at its default (never silently ignored), and why
UNSUPPORTED = {
    "loss": "its per-token loss is plain GRPO's times the truncated importance weight; "
    "the cov / reco variants are not defined on a mixed group",
    "beta": "it has no KL penalty to a reference model",
    "num_iterations": "it takes one step per generated batch (pi_old = the current weights)",
    "lora_r": "its nodes train all parameters (no LoRA)",
    "lora_alpha": "its nodes train all parameters (no LoRA)",
    "lora_targets": "its nodes train all parameters (no LoRA)",
}


@dataclass
class FTISConfig(GRPOConfig):
    nodes: str = ""
    """Comma-separated models, one per node (aliases, directories or hub ids); default: --n-nodes copies of --model."""
    n_nodes: int = 2
    """Number of nodes when --nodes is not given (each samples with its own seed)."""
    steps: int = 3
    """Optimizer steps per node."""
    prompts_per_step: int = 2
    """Distinct prompts per step, the same for every node."""
    num_generations: int = 12
    """G: completions each node samples per prompt (the paper's group size 12); the mixed group has K x G."""
    checkpoint_every: int = 1
    """Save every node's resumable checkpoint every this many steps (and at the end)."""
    tis_cap: float = 2.0
    """C: truncated importance weight min(pi_old / mu, C) on off-policy tokens."""
    kl_filter: float = 50.0
    """gamma: an off-policy completion with advantage <= 0 and summed KL from its generator >= gamma is dropped (paper ablates 5, 10)."""
    no_retokenize: bool = False
    """Refuse to share text across tokenizers (then every node must use the same tokenizer)."""
    skip_grpo_baseline: bool = False
    """Do not run the comparison arm: on-policy GRPO per node alone (same steps, prompts and K x G own completions per prompt)."""
    ood_task: str | None = None
    """A second task for out-of-distribution accuracy before and after training (its first --n-test test examples)."""
    eval_every: int = 1
    """Evaluate greedy test accuracy of every node every this many steps (and at the end)."""
    skip_test_eval: bool = False
    """Do not evaluate on the test split (and OOD task) at all."""
    eval_nodes: str = ""
    """Comma-separated indices of the nodes evaluated on the test split (default: every node); `corp bench` evaluates
    node 0 only, the one its row reports (the others' evaluations would only feed this run's own report)."""

    def validate(self) -> FTISConfig:
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
        for name, why in UNSUPPORTED.items():  # before GRPO's checks: the first line says what F-TIS lacks
            if getattr(self, name) != defaults[name]:
                given = f"{flag(name, self)} {getattr(self, name)}"
                raise CorpError(f"{given}: corp ftis does not support it ({why}); drop it")
        super().validate()
        for name in ("eval_every", "n_nodes"):
            if getattr(self, name) < 1:
                raise CorpError(f"{flag(name, self)} must be >= 1, got {getattr(self, name)}")
        if len(self.node_models()) < 2:
            raise CorpError(
                f"--nodes '{self.nodes}' names one model; F-TIS needs "
                "two or more nodes (or drop --nodes and use --n-nodes)"
            )
        if not (self.tis_cap > 0 and math.isfinite(self.tis_cap)):
            raise CorpError(f"--tis-cap must be > 0 and finite, got {self.tis_cap}")
        if not self.kl_filter > 0:
            raise CorpError(f"--kl-filter must be > 0, got {self.kl_filter}")
        self.evaluated_nodes()  # a bad --eval-nodes is one line before any model loads
        return self

    def evaluated_nodes(self) -> list[int]:
        """The node indices --eval-nodes names (every node when empty)."""
        k = len(self.node_models())
        if not self.eval_nodes.strip():
            return list(range(k))
        try:
            picked = sorted({int(x) for x in self.eval_nodes.split(",") if x.strip()})
        except ValueError:
            picked = [-1]
        if not picked or picked[0] < 0 or picked[-1] >= k:
            raise CorpError(
                f"--eval-nodes '{self.eval_nodes}' must name node indices between 0 and {k - 1} (comma-separated)"
            )
        return picked

    def check_group(self) -> None:
        # the group is the mixed one of K x G >= 2 completions, so one per node is enough; a last
        # micro-batch shorter than the others is allowed (GRPOTrainer.micro_batch_step)
        if self.num_generations < 1:
            raise CorpError(f"--num-generations must be >= 1, got {self.num_generations}")

    def node_models(self) -> list[str]:
        if self.nodes.strip():
            return [m.strip() for m in self.nodes.split(",") if m.strip()]
        return [self.model] * self.n_nodes
