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

    def generate(self, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, n: int = 1, seed: int | None = None, stop: tuple[str, ...] | None = None) -> Generations:
        """n completions per prompt (prompt-major order), greedy when temperature == 0; a completion
        ends at the first of the `stop` strings, which is cut from its text (tokens up to and
        including the one that completed it are counted)."""
        raise NotImplementedError

    def set_direction(self, direction: Direction | None) -> None:
        """Weights := base + direction (None: the base)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def cut_at_stop(tokenizer, ids: list[int], stop) -> tuple[list[int], str]:
    """(ids, text) of a completion cut at the first stop string: the shortest prefix of `ids` whose
    text holds a stop string (binary search: holding one is monotone in the prefix length), and
    that text up to the stop string. Without a stop string in the text: all ids, the full text."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if not stop or not any(s in text for s in stop):
        return ids, text
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(ids[:mid], skip_special_tokens=True) for s in stop):
            hi = mid
        else:
            lo = mid + 1
    cut = min(text.find(s) for s in stop if s in text)
    return ids[:lo], text[:cut]
