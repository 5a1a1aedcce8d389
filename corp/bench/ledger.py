"""The compute ledger (docs/architecture.md, "Compute ledger").

Every method records prompt tokens, generated tokens and trained tokens; FLOPs are estimated as
2 * N_params * (prompt + generated tokens) + 6 * N_params * trained tokens, the usual
forward ~2N / forward+backward ~6N per token rule (attention's sequence-length term is ignored,
which is small at these lengths). The formula is written into every report next to the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOPS_FORMULA = "FLOPs = 2 * N_params * (prompt_tokens + generated_tokens) + 6 * N_params * trained_tokens"


@dataclass
class Ledger:
    n_params: int
    prompt_tokens: int = 0
    generated_tokens: int = 0
    trained_tokens: int = 0

    def add_generation(self, prompt_tokens: int, generated_tokens: int) -> "Ledger":
        self.prompt_tokens += int(prompt_tokens)
        self.generated_tokens += int(generated_tokens)
        return self

    @property
    def inference_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens

    @property
    def flops(self) -> float:
        return 2.0 * self.n_params * self.inference_tokens + 6.0 * self.n_params * self.trained_tokens

    def to_dict(self) -> dict:
        return {
            "n_params": self.n_params,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "flops": self.flops,
        }
