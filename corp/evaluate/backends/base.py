"""The backend contract: what every caller may ask of a backend, and nothing it has to probe for.

Every backend has:
- `name` ("hf", "vllm"), `model_id` (the hub id or path its weights came from; None only for a
  backend built around an in-memory model, which the caller then names by its config's --model),
  `n_params` (all parameters, for the compute ledger) and `weights_hash` (sha256 of the base
  weights, `corp.perturb.weights_hash`; it keys populations and evaluations);
- `set_direction(direction)`: weights := base + direction, exactly (None: the base);
- `generate(prompts, max_new_tokens, temperature, top_p, n, seed, stop)`;
- `close()`.

What only some backends can do is a named capability (`CAPABILITIES`), asked with
`backend.supports(name)` and demanded with `backend.require(name, "corp es")`, which raises one
`CorpError` line naming the backend and what to pass instead:
- `perturber`: corp's in-process `Perturber` on the backend's own weights (`backend.perturber`),
  for direction algebra that reads or keeps weights (Gram matrices, merged directions kept across
  a step search, low-rank projection, ES's moving centre);
- `model`: the in-process transformers model and tokenizer (`backend.model`, `backend.tokenizer`),
  for saving the model, training it, exporting LoRA;
- `logprobs`: `backend.logprobs(prompts, completions)`, the per-token log-probabilities of given
  completions under the current weights.
The attributes behind a capability raise the same error when it is missing, so a caller that
forgets to ask still gets one line, not an AttributeError.

Every backend counts tokens the same way (prompt tokens as tokenised after the chat template;
generated tokens up to and including the end-of-sequence token) so the compute ledger is
comparable across backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corp import CorpError
from corp.perturb import Direction

PERTURBER, MODEL, LOGPROBS = "perturber", "model", "logprobs"
CAPABILITIES = {
    PERTURBER: "corp's in-process Perturber on the model's weights",
    MODEL: "the in-process transformers model and tokenizer",
    LOGPROBS: "log-probabilities of given completions",
}


@dataclass
class Generations:
    texts: list[str]
    prompt_tokens: list[int]
    generated_tokens: list[int]
    seconds: float = 0.0
    token_ids: list[list[int]] = field(default_factory=list)  # generated ids, for trainers


class _Provided:
    """An attribute that a backend sets in its __init__ when it has `capability`. A non-data
    descriptor: the instance's own value wins, so a backend that has it simply assigns it; reading
    it on a backend that does not have it raises the capability's one-line error."""

    def __init__(self, capability: str | None):
        self.capability = capability

    def __set_name__(self, owner, name: str) -> None:
        self.attr = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if self.capability is not None:
            obj.require(self.capability, f"`backend.{self.attr}`")
        # the backend declares the capability (or the attribute is part of every backend) but never set it
        raise NotImplementedError(f"{type(obj).__name__} does not set `{self.attr}`, which the backend contract requires")


class Backend:
    """The contract (module docstring). Subclasses set `name`, `model_id`, `n_params` and
    `weights_hash` (an attribute or a property), list what they can do in `capabilities`, and
    assign the attributes those capabilities provide."""

    name = "base"
    capabilities: frozenset[str] = frozenset()
    model_id: str | None = None
    n_params: int = 0
    weights_hash = _Provided(None)  # str: sha256 of the base weights (corp.perturb.weights_hash)
    perturber = _Provided(PERTURBER)  # corp.perturb.Perturber
    model = _Provided(MODEL)  # transformers model
    tokenizer = _Provided(MODEL)  # its tokenizer
    instead = "pass --backend hf"  # what a missing capability's error tells the user to do

    def describe(self) -> str:
        return f"the '{self.name}' backend"

    def supports(self, capability: str) -> bool:
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown backend capability '{capability}'; known: {', '.join(CAPABILITIES)}")
        return capability in self.capabilities

    def require(self, capability: str, needed_by: str) -> None:
        """Raise one CorpError line unless this backend has `capability` (`needed_by` names the
        command or step that needs it, e.g. "corp es")."""
        if not self.supports(capability):
            raise CorpError(f"{needed_by} needs {CAPABILITIES[capability]}, which {self.describe()} does not provide; {self.instead}")

    def generate(self, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, n: int = 1, seed: int | None = None, stop: tuple[str, ...] | None = None) -> Generations:
        """n completions per prompt (prompt-major order), greedy when temperature == 0; a completion
        ends at the first of the `stop` strings, which is cut from its text (tokens up to and
        including the one that completed it are counted)."""
        raise NotImplementedError

    def set_direction(self, direction: Direction | None) -> None:
        """Weights := base + direction (None: the base)."""
        raise NotImplementedError

    def logprobs(self, prompts: list[str], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Capability `logprobs`: for each (prompt, completion token ids) pair, the log-probability
        of every completion token given the prompt (formatted as `generate` formats it) and the
        tokens before it, under the current weights, from logits / temperature."""
        self.require(LOGPROBS, "`backend.logprobs`")
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
