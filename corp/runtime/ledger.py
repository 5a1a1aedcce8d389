"""The compute ledger (docs/architecture.md, "Compute ledger").

Every method records prompt tokens, generated tokens and trained tokens; FLOPs are estimated as
2 * N_params * (prompt + generated tokens) + 6 * N_params * trained tokens, the usual
forward ~2N / forward+backward ~6N per token rule (attention's sequence-length term is ignored,
which is small at these lengths). The formula is written into every report next to the numbers.

LoRA training is charged like full fine-tuning, 6 N per trained token (`LORA_CONVENTION`). A LoRA
backward still propagates activation gradients through every frozen matrix (about 2 N per token)
but computes weight gradients only for the adapters (about 2 N_trainable, N_trainable << N), so its
true cost is about 4 N + 6 N_trainable per token: the ledger overcharges a LoRA run by up to about
1.5x. This is a conservative charge against GRPO-LoRA (and FGRPO with LoRA): at a FLOP budget a
LoRA run gets about two thirds of the training steps its true compute would buy. Kept because one
rule for every method is simpler to audit than a per-method discount.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tqdm.auto import tqdm

from corp.runtime.progress import progress_disabled

FLOPS_FORMULA = "FLOPs = 2 * N_params * (prompt_tokens + generated_tokens) + 6 * N_params * trained_tokens"
LORA_CONVENTION = (
    "LoRA training is charged 6 N per trained token like full fine-tuning, though a LoRA backward computes no "
    "weight gradients for the frozen matrices (about 4 N + 6 N_trainable): a conservative charge against "
    "GRPO-LoRA, which gets about two thirds of the steps its true compute would buy."
)


def flops(n_params: int, prompt_tokens: int = 0, generated_tokens: int = 0, trained_tokens: int = 0) -> float:
    """FLOPS_FORMULA; the one place it is computed (the bench's budget rules call it too)."""
    return 2.0 * n_params * (prompt_tokens + generated_tokens) + 6.0 * n_params * trained_tokens


@dataclass
class Ledger:
    n_params: int
    prompt_tokens: int = 0
    generated_tokens: int = 0
    trained_tokens: int = 0

    def add_generation(self, prompt_tokens: int, generated_tokens: int) -> Ledger:
        self.prompt_tokens += int(prompt_tokens)
        self.generated_tokens += int(generated_tokens)
        return self

    def add_rows(self, rows) -> Ledger:
        """Add the generations behind result rows (each with `prompt_tokens` and `generated_tokens`)."""
        for r in rows:
            self.add_generation(r["prompt_tokens"], r["generated_tokens"])
        return self

    @property
    def inference_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens

    @property
    def flops(self) -> float:
        return flops(self.n_params, self.prompt_tokens, self.generated_tokens, self.trained_tokens)

    def to_dict(self) -> dict:
        return {
            "n_params": self.n_params,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "flops": self.flops,
        }


# ---------------------------------------------------------------- time: what a long step will take


def duration(seconds: float) -> str:
    """A duration as a person reads it: '40 s', '12 min', '1.5 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def say_expected(
    what: str, left: int, unit: str, seconds_each: float, parallel: int = 1, basis: str = "as the first took"
) -> None:
    """One line, before a long step goes on, saying what it will take: `left` more `unit` (a plural) at
    `seconds_each` (`basis`: where that rate comes from), `parallel` at a time. On stderr, where the
    progress bars are, and like them not under CORP_NO_PROGRESS (tests, logs, the bench's processes)."""
    if left < 1 or progress_disabled():
        return
    at_once = f", {parallel} at a time" if parallel > 1 else ""
    tqdm.write(
        f"{what}: {left} {unit} to go, about {duration(seconds_each * left / max(1, parallel))} "
        f"({seconds_each:.3g} s each, {basis}{at_once})",
        file=sys.stderr,
    )


class Passes(NamedTuple):
    """A stage still to run, for `say_passes`: `passes` over a split, `examples` generated in all by
    them; `at_most`: the count is an upper bound (a stage that may stop early)."""

    stage: str
    passes: int
    examples: int
    at_most: bool = False


def seconds_per_example(rows: Iterable[dict]) -> float | None:
    """What scored rows (the result-row schema) took per example: generation, setting the weights and
    the reward, over the examples they were scored on; None when they hold no time."""
    seconds = examples = 0.0
    for r in rows:
        seconds += r.get("seconds", 0.0) + r.get("apply_seconds", 0.0) + r.get("reward_seconds", 0.0)
        examples += r.get("n_examples") or len(r.get("correct", ()))
    return seconds / examples if seconds > 0 and examples > 0 else None


def say_passes(what: str, stages: Sequence[Passes], seconds_each_example: float | None, basis: str) -> None:
    """One line, before the stages after a measured one (a population) go on, saying what they will take:
    their passes, stage by stage, and their time at `seconds_each_example` (`basis`: where that rate comes
    from). Passes over splits of different sizes are timed by the examples they generate. On stderr and not
    under CORP_NO_PROGRESS, like `say_expected`."""
    todo = [s for s in stages if s.passes > 0]
    if not todo or not seconds_each_example or progress_disabled():
        return
    bound = any(s.at_most for s in todo)
    seconds = seconds_each_example * sum(s.examples for s in todo)
    parts = ", ".join(f"{s.stage} {'up to ' if s.at_most else ''}{s.passes}" for s in todo)
    tqdm.write(
        f"{what}: {'up to ' if bound else ''}{sum(s.passes for s in todo)} passes to go, "
        f"about {duration(seconds)}{' at most' if bound else ''} "
        f"({parts}; {seconds_each_example:.3g} s per example, {basis})",
        file=sys.stderr,
    )
