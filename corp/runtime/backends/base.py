"""The backend contract: what every caller may ask of a backend, and nothing it has to probe for.

Every backend has:
- `name` ("hf", "vllm"), `model_id` (the hub id or path its weights came from; None only for a
  backend built around an in-memory model, which the caller then names by its config's --model),
  `n_params` (all parameters, for the compute ledger) and `weights_hash` (sha256 of the base
  weights, `corp.algorithms.perturb.weights_hash`; it keys populations and evaluations);
- `set_direction(direction)`: weights := base + direction, exactly (None: the base);
- `move_base(components)`: base := base + components, kept in fp32 and added in order (ES's
  centre); `push_weights()`: the engine's base := the model's weights as they are now (after a
  training step). `shares_weights`: whether `perturber` and `model` are the engine's own weights
  (hf) or corp's host copy beside an engine that keeps them elsewhere (vLLM, a Ray driver;
  `corp.runtime.backends.host`), which follows the engine's direction when read;
- `generate(prompts, max_new_tokens, temperature, top_p, n, seed, stop, seeds)`; sampling
  (temperature > 0) is seeded per completion (see "Seeded sampling" below);
- `close()`.

What only some backends can do is a named capability (`CAPABILITIES`), asked with
`backend.supports(name)` and demanded with `backend.require(name, "corp es")`, which raises one
`CorpError` line naming the backend and what to pass instead:
- `perturber`: corp's in-process `Perturber` on the backend's weights or its host copy (`backend.perturber`),
  for direction algebra that reads or keeps weights (Gram matrices, merged directions kept across
  a step search, low-rank projection, ES's moving centre);
- `model`: the in-process transformers model and tokenizer (`backend.model`, `backend.tokenizer`),
  for saving the model, training it, exporting LoRA;
- `logprobs`: `backend.logprobs(prompts, completions)`, the per-token log-probabilities of given
  completions under the current weights.
The attributes behind a capability raise the same error when it is missing, so a caller that
forgets to ask still gets one line, not an AttributeError.

Seeded sampling: completion j of prompt i is drawn from its own random stream, seeded with
`completion_seed(seeds[i], j)`, where `seeds[i]` is the prompt's seed (given per prompt, or derived
from one batch `seed` as `prompt_seeds(seed, len(prompts))`). A completion's draws therefore do not
depend on which other prompts share its batch, their order, or the backend's batch size, and a
rerun or a resumed run draws the same samples. (Evaluations derive each prompt's seed from the
run's seed, what is evaluated and the example id: `corp.runtime.context.sampling_seeds`.) What can
still differ between batchings is the floating-point rounding of the logits, as for greedy
decoding. Without any seed a sampled call draws a fresh one (not reproducible).

A prompt that, with the `max_new_tokens` asked for, needs more positions than the model has
(`context_length`: the config's max_position_embeddings; vLLM's max_model_len) is refused in one
line (`check_fits`) before anything is generated: the run layer checks every prompt of a run's
splits once, naming the example, and `generate` checks each batch it is given.

Every backend counts tokens the same way (prompt tokens as tokenised after the chat template;
generated tokens up to and including the end-of-sequence token) so the compute ledger is
comparable across backends.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from corp.algorithms.perturb import Direction
from corp.errors import CorpError, PromptTooLong

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


def _seed63(*parts) -> int:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: a valid seed for torch and for vLLM


def prompt_seeds(seed: int, n_prompts: int) -> list[int]:
    """Per-prompt seeds from one batch seed (prompt i of the call: its position is its identity)."""
    return [_seed63("corp-prompt", int(seed), i) for i in range(n_prompts)]


def completion_seed(prompt_seed: int, j: int) -> int:
    """The seed of completion j of a prompt whose seed is `prompt_seed`."""
    return _seed63("corp-sample", int(prompt_seed), int(j))


def resolve_seeds(n_prompts: int, seed: int | None, seeds: Sequence[int] | None) -> list[int]:
    """The per-prompt seeds of a sampled `generate` call (module docstring, "Seeded sampling")."""
    if seeds is not None:
        if len(seeds) != n_prompts:
            raise ValueError(f"generate: {n_prompts} prompts but {len(seeds)} seeds")
        return [int(s) for s in seeds]
    return prompt_seeds(secrets.randbits(63) if seed is None else seed, n_prompts)


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
        raise NotImplementedError(
            f"{type(obj).__name__} does not set `{self.attr}`, which the backend contract requires"
        )


class Backend:
    """The contract (module docstring). Subclasses set `name`, `model_id`, `n_params` and
    `weights_hash` (an attribute or a property), list what they can do in `capabilities`, and
    assign the attributes those capabilities provide."""

    name = "base"
    capabilities: frozenset[str] = frozenset()
    model_id: str | None = None
    n_params: int = 0
    weights_hash = _Provided(None)  # str: sha256 of the base weights (corp.algorithms.perturb.weights_hash)
    perturber = _Provided(PERTURBER)  # corp.algorithms.perturb.Perturber
    model = _Provided(MODEL)  # transformers model
    tokenizer = _Provided(MODEL)  # its tokenizer
    instead = "pass --backend hf"  # what a missing capability's error tells the user to do
    context_length: int | None = None  # positions a prompt and its completion may fill (None: not known)
    context_source = "max_position_embeddings"  # where context_length comes from, for check_fits' line
    shares_weights = True  # `perturber`/`model` are the weights the engine generates with (module docstring)

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
            raise CorpError(
                f"{needed_by} needs {CAPABILITIES[capability]}, which "
                f"{self.describe()} does not provide; {self.instead}"
            )

    def generate(
        self,
        prompts: list[str],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int | None = None,
        stop: tuple[str, ...] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Generations:
        """n completions per prompt (prompt-major order), greedy when temperature == 0; a completion
        ends at the first of the `stop` strings, which is cut from its text (tokens up to and
        including the one that completed it are counted). Sampling is seeded per completion from
        `seeds` (one per prompt) or else `seed` (module docstring, "Seeded sampling")."""
        raise NotImplementedError

    def prompt_lengths(self, prompts: list[str]) -> list[int] | None:
        """Tokens of each prompt as `generate` feeds it (None: this backend cannot say without
        generating); the run layer checks every prompt against `context_length` with it, once."""
        return None

    def set_direction(self, direction: Direction | None) -> None:
        """Weights := base + direction (None: the base)."""
        raise NotImplementedError

    def prefetch(self, direction: Direction | None) -> None:
        """A hint: `direction` is the next one to be set; an engine may start building its weights
        now, while it generates with the current ones (hf: `Perturber.prefetch`). Changes no bits."""

    def move_base(self, components) -> None:
        """Base := base + components (fp32, in order: `Perturber.move_base`); the current direction stays applied."""
        self.require(PERTURBER, "moving the base (ES's centre)")
        self.perturber.move_base(components)

    def push_weights(self, state: dict | None = None) -> None:
        """The engine's base := `state` (HF-named tensors; default: the model's weights as they are
        now). Nothing to do where the engine generates with the model itself (`shares_weights`)."""

    def logprobs(self, prompts: list[str], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Capability `logprobs`: for each (prompt, completion token ids) pair, the log-probability
        of every completion token given the prompt (formatted as `generate` formats it) and the
        tokens before it, under the current weights, from logits / temperature."""
        self.require(LOGPROBS, "`backend.logprobs`")
        raise NotImplementedError

    def release_engine(self) -> None:
        """A method done generating lets the engine go and keeps `model` and `perturber` (CoRP before it
        saves: the host copy then materialises its model beside no engine). Nothing to do where the
        engine is the model itself (`shares_weights`)."""

    def close(self) -> None:
        pass


def context_of(config) -> int | None:
    """The positions a transformers config's model was built for (None when the config names none)."""
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_fits(
    lengths: Sequence[int], max_new_tokens: int, context: int | None, source: str, names: Sequence[str] | None = None
) -> None:
    """One line for the first prompt of `lengths` (tokens) that with `max_new_tokens` does not fit
    `context` positions (`source` says where that number comes from), before anything is generated:
    past it a model asks for memory quadratic in the length (a 1 MB prompt: 1 TB) or runs for hours."""
    if context is None:
        return
    room = context - max_new_tokens
    for i, n in enumerate(lengths):
        if n > room:
            who = names[i] if names is not None else f"a prompt of this batch (number {i})"
            raise PromptTooLong(
                f"{who} is {n} tokens long; with {max_new_tokens} new tokens it needs {n + max_new_tokens} "
                f"positions, more than the model's context of {context} ({source}); shorten or drop that prompt, "
                "lower --max-completion-length, or use a model with a longer context"
            )


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
