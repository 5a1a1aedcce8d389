"""Generate on examples and score every completion: one model (`evaluate`, `evaluate_current`), one
specialist's row (`score_one`, which every executor uses), or generations made elsewhere
(`score_generations`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from corp.algorithms.perturb import Direction
from corp.evaluate.rewards import compute_rewards
from corp.evaluate.tasks import Example
from corp.runtime.context.keys import direction_fingerprint, eval_identity, sampling_seeds, specialist_what
from corp.runtime.context.rows import EvalResult, result_row
from corp.runtime.context.run_context import RunContext


def evaluate(
    ctx: RunContext,
    examples: Sequence[Example],
    direction: Direction | None = None,
    n: int = 1,
    temperature: float = 0.0,
) -> EvalResult:
    """Generate on `examples` with weights base + direction and score every completion."""
    ctx.backend.set_direction(direction)
    return evaluate_current(ctx, examples, n=n, temperature=temperature, what=direction_fingerprint(direction))


def evaluate_current(
    ctx: RunContext, examples: Sequence[Example], n: int = 1, temperature: float = 0.0, what: str | None = None
) -> EvalResult:
    """Like `evaluate`, with the backend's weights as they are now; `what` names them (it seeds
    sampling, with the run's seed: `sampling_seeds`)."""
    kwargs = {}
    if temperature > 0:
        if what is None:
            raise ValueError("a sampled evaluation needs `what` (it seeds the samples)")
        kwargs["seeds"] = sampling_seeds(ctx.cfg.seed, what, [e.id for e in examples])
    gens = ctx.backend.generate(
        [e.prompt for e in examples],
        ctx.max_new_tokens,
        temperature=temperature,
        n=n,
        stop=ctx.task.stop or None,
        **kwargs,
    )  # stop: the task's (in its signature)
    return score_generations(ctx, examples, gens, n)


def score_generations(ctx: RunContext, examples: Sequence[Example], gens, n: int = 1) -> EvalResult:
    """Score generations made on `examples` (n per example, prompt-major): the one scoring of
    completions, for one model's generations and for one specialist's share of a batched pass."""
    exs = [e for e in examples for _ in range(n)]
    t0 = time.perf_counter()
    rewards, errors = compute_rewards(ctx.task, gens.texts, exs, ctx.reward_fn)
    reward_s = time.perf_counter() - t0
    answers = [ctx.task.extract(t) for t in gens.texts]
    correct = (
        [ctx.task.check(a, e) for a, e in zip(answers, exs)]
        if ctx.reward_fn is not None
        else [r >= 1.0 for r in rewards]
    )
    status = ctx.task.last_status_counts() if hasattr(ctx.task, "last_status_counts") else {}
    return EvalResult(
        gens.texts,
        answers,
        rewards,
        correct,
        sum(gens.prompt_tokens),
        sum(gens.generated_tokens),
        gens.seconds,
        errors,
        status,
        reward_seconds=reward_s,
        truncated=sum(g >= ctx.max_new_tokens for g in gens.generated_tokens),
    )


def score_one(
    ctx: RunContext,
    seed: int | None,
    sigma: float | None,
    split: str,
    context: dict | None = None,
    following: tuple[int | None, float | None] | None = None,
    **extra,
) -> dict:
    """Set the backend to specialist (seed, sigma) (None: the base), evaluate it on `split`, return
    its row (not cached: the caller appends it). Every executor makes rows with this function.
    `following`: the specialist scored next, whose weights the backend may start building while
    this one generates (`Backend.prefetch`)."""
    t0 = time.perf_counter()
    ctx.backend.set_direction(None if seed is None else Direction.single(seed, sigma))
    apply_s = time.perf_counter() - t0
    parts = getattr(ctx.backend, "last_apply_split", None)  # vllm: noise draw and weight push apart
    if parts:
        extra = {**parts, **extra}
    if following is not None and following[0] is not None:
        ctx.backend.prefetch(Direction.single(following[0], following[1]))
    examples = ctx.splits[split]
    identity = eval_identity(context or ctx.eval_context(), specialist_what(seed, sigma), [e.id for e in examples])
    res = evaluate_current(ctx, examples)
    return result_row(
        identity,
        split,
        res,
        "base" if seed is None else "specialist",
        seed=seed,
        sigma=None if sigma is None else float(sigma),
        apply_seconds=apply_s,
        **extra,
    )
