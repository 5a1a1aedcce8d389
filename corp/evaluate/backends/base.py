"""The backend contract: generate completions for prompts under the current weights, and set the
weights to base + direction exactly.

Every backend counts tokens the same way (prompt tokens as tokenised after the chat template;
generated tokens up to and including the end-of-sequence token) so the compute ledger is
comparable across backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corp.perturb import Direction


@dataclass
class Generations:
    texts: list[str]
    prompt_tokens: list[int]
    generated_tokens: list[int]
    seconds: float = 0.0
    token_ids: list[list[int]] = field(default_factory=list)  # generated ids, for trainers


class Backend:
    name = "base"
    n_params: int = 0

    def generate(self, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, n: int = 1, seed: int | None = None) -> Generations:
        """n completions per prompt (prompt-major order), greedy when temperature == 0."""
        raise NotImplementedError

    def set_direction(self, direction: Direction | None) -> None:
        """Weights := base + direction (None: the base)."""
        raise NotImplementedError

    def close(self) -> None:
        pass
