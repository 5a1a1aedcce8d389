"""Population scoring in one batched factored pass, when the run's noise is low-rank and the
backend is hf (`corp.runtime.backends.batched_lowrank`), or as multi-LoRA requests when it is a
LoRA-enabled vllm backend (`corp.runtime.backends.vllm_lora`; rows carry `scoring: "lora"`).

The local executor asks `factored_for(ctx)`; when it answers, the population's specialists are
scored by `score_factored`, which makes each specialist's row exactly as `score_one` does (same
identity and key, same scoring of completions, `result_row`), from its share of the batched
generations. Only the generations differ from the one-at-a-time materialised path, by
floating-point rounding (the tolerance is stated in batched_lowrank). Rows are yielded as each
group of specialists finishes, so a kill loses at most the group in flight. Rows carry
`scoring: "factored"` (not part of the key) so a population says how it was scored. The base
(seed None) is scored by `score_one`.

`direction_rows` does the same for directions (CoRP's step-search candidates, gates and test row
on a low-rank population): a direction of seed components and merged terms is, per matrix, one
factor pair of rank <= K R (`FactoredPopulation.direction_factors`), and a step search's step sizes
are that pair at several scales, generated as row groups of one pass; each row is the row
`cached_eval` would make (same key), with `scoring: "factored"`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator, Sequence

from corp.algorithms.perturb import Direction, lowrank_rank
from corp.errors import CorpError
from corp.runtime.backends.batched_lowrank import FactoredPopulation, direction_generations, population_generations
from corp.runtime.context import (
    RunContext,
    direction_fingerprint,
    eval_identity,
    eval_key,
    result_row,
    score_generations,
    score_one,
    specialist_what,
)

_factored: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> FactoredPopulation | None


def factored_for(ctx: RunContext):
    """The backend's FactoredPopulation when this run's population can be scored in one batched
    pass (low-rank scheme, in-process hf backend whose Perturber uses the run's scheme); else None.
    A model whose matrices are not all nn.Linear / nn.Embedding weights is scored one at a time
    (with a warning)."""
    if lowrank_rank(ctx.noise_scheme) is None:
        return None
    backend = ctx.backend
    lora_population = getattr(backend, "lora_population", None)
    if lora_population is not None:  # vllm: one LoRA adapter per specialist, no weight reload
        return lora_population()
    if not hasattr(backend, "generate_rows") or not backend.supports("perturber") or not backend.supports("model"):
        return None
    if backend.perturber.scheme != ctx.noise_scheme:
        raise CorpError(
            f"the backend materialises noise scheme {backend.perturber.scheme}, but "
            f"this run's is {ctx.noise_scheme}; build it with scheme={ctx.noise_scheme}"
        )
    if backend not in _factored:
        try:
            _factored[backend] = FactoredPopulation(backend.model, backend.perturber.params, ctx.noise_scheme)
        except CorpError as exc:
            warnings.warn(f"{exc}; scoring one specialist at a time with materialised weights")
            _factored[backend] = None
    return _factored[backend]


def direction_factored_for(ctx: RunContext):
    """`factored_for(ctx)` where it can also score directions (hf's FactoredPopulation), else None. The
    vllm backend's multi-LoRA population scores specialists only: a merged direction of K components has
    rank up to K R, beyond the engine's LoRA slot rank (chosen for one specialist's R), so directions take
    the dense path there (the engine materialises them in its weights)."""
    factored = factored_for(ctx)
    return factored if hasattr(factored, "direction_factors") else None


def score_factored(
    ctx: RunContext, specialists: Sequence[tuple[int | None, float | None]], split: str, context: dict | None = None
) -> Iterator[dict]:
    """Rows of `specialists` on `split` (as `score_one` makes them), the specialists generated in
    batched groups. The caller has checked `factored_for(ctx)`."""

    factored = factored_for(ctx)
    examples = ctx.splits[split]
    context = context or ctx.eval_context()
    ids = [e.id for e in examples]
    specs = [(int(s), float(sg)) for s, sg in specialists if s is not None]
    for seed, sigma in specialists:
        if seed is None:
            yield score_one(ctx, seed, sigma, split, context)
    if not specs:
        return
    prompts, stop = [e.prompt for e in examples], ctx.task.stop or None
    if hasattr(factored, "generations"):  # vllm multi-LoRA
        produced = factored.generations(specs, prompts, ctx.max_new_tokens, stop)
    else:
        produced = population_generations(ctx.backend, factored, specs, prompts, ctx.max_new_tokens, stop)
    scoring = getattr(factored, "scoring", "factored")
    for i, gens, draw_s in produced:
        seed, sigma = specs[i]
        res = score_generations(ctx, examples, gens)
        identity = eval_identity(context, specialist_what(seed, sigma), ids)
        yield result_row(
            identity, split, res, "specialist", seed=seed, sigma=sigma, apply_seconds=draw_s, scoring=scoring
        )


def direction_key(ctx: RunContext, direction: Direction | None, split: str, context: dict | None = None) -> str:
    """The key `cached_eval` gives the greedy evaluation of base + `direction` on `split`."""
    ids = [e.id for e in ctx.splits[split]]
    identity = eval_identity(context or ctx.eval_context(), direction_fingerprint(direction), ids, seed=ctx.cfg.seed)
    return eval_key(identity)


def direction_rows(
    ctx: RunContext, directions: Sequence[Direction], split: str, context: dict | None = None, **extra
) -> Iterator[tuple[int, dict]]:
    """(index, row) of the greedy evaluation of base + each direction on `split` that the factored
    pass can score (`direction_factored_for(ctx)` answers and the direction is seed components or merged
    terms); the others are left out (the caller evaluates them as before). Directions sharing one
    update (the same merged term at several scales) are generated together. `extra`: row fields."""
    import time

    factored = direction_factored_for(ctx)
    if factored is None:
        return
    examples = ctx.splits[split]
    context = context or ctx.eval_context()
    ids = [e.id for e in examples]
    groups: dict[int, tuple[dict, list[tuple[int, float]], float]] = {}  # id(unit factors) -> members
    for j, d in enumerate(directions):
        if d is None or d.is_zero() or direction_fingerprint(d) == "base":
            continue
        t0 = time.perf_counter()
        found = factored.direction_factors(d)
        if found is None:
            continue
        unit, scale = found
        entry = groups.setdefault(id(unit), (unit, [], 0.0))
        groups[id(unit)] = (unit, entry[1] + [(j, scale)], entry[2] + time.perf_counter() - t0)
    for unit, members, build_s in groups.values():
        gens = direction_generations(
            ctx.backend,
            factored,
            unit,
            [s for _, s in members],
            [e.prompt for e in examples],
            ctx.max_new_tokens,
            ctx.task.stop or None,
        )
        for i, g, install_s in gens:
            j = members[i][0]
            identity = eval_identity(context, direction_fingerprint(directions[j]), ids, seed=ctx.cfg.seed)
            res = score_generations(ctx, examples, g)
            apply_s = install_s + build_s / len(members)
            yield j, result_row(identity, split, res, "direction", apply_seconds=apply_s, scoring="factored", **extra)
