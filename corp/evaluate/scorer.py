"""Scoring: evaluate a model (base + direction) on a split, and score a population of specialists.

The population contract (DESIGN.md, "Population"): `population.jsonl` holds one row per scored
specialist, keyed `"<seed>:<sigma>:<split>"`, appended and fsynced per specialist, so a kill loses
at most the specialist in flight and a rerun on the same run directory skips what is done.
`population_meta.json` records what the rows mean (model and its weights hash, task, split ids,
noise scheme, parameter filter, generation length); reusing a population under a different
meaning is an error, never a silent mix.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from corp import CorpError
from corp.bench.ledger import Ledger
from corp.config import PopulationConfig, RunConfig, config_to_dict
from corp.evaluate.backends import Backend, make_backend
from corp.evaluate.rewards import compute_rewards, resolve_reward
from corp.evaluate.tasks import SPLITS, Example, SplitSizes, Task, get_task, make_splits
from corp.perturb import SCHEME_VERSION, Direction, ParamFilter, specialist_seeds, weights_hash
from corp.runs import append_jsonl, prepare_run_dir, read_json, read_jsonl, write_json, write_yaml


@dataclass
class EvalResult:
    """Per-example outcome of one model on one split."""

    completions: list[str]
    answers: list[str | None]
    rewards: list[float]
    correct: list[bool]
    prompt_tokens: int
    generated_tokens: int
    seconds: float
    reward_errors: int = 0
    status_counts: dict = field(default_factory=dict)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / len(self.correct) if self.correct else 0.0


@dataclass
class RunContext:
    """Everything a command needs: resolved config, task, splits, backend, reward, run directory."""

    cfg: RunConfig
    method: str
    task: Task
    splits: dict[str, list[Example]]
    run_dir: Path
    reward_fn: Callable | None
    _backend: Backend | None = None
    _weights_hash: str | None = None
    _executor: object | None = None  # corp.evaluate.executors: where population scoring runs

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            from corp.perturb import ParamFilter

            pf = ParamFilter(getattr(self.cfg, "include", ".*"), getattr(self.cfg, "exclude", ""))
            self._backend = make_backend(self.cfg.backend, self.cfg.model, self.cfg.device, self.cfg.dtype, self.cfg.batch_size, pf)
        return self._backend

    @property
    def max_new_tokens(self) -> int:
        return self.cfg.max_new_tokens or self.task.max_new_tokens

    @property
    def weights_hash(self) -> str:
        if self._weights_hash is None:
            known = getattr(self.backend, "weights_hash", None)  # backends without an HF model (vllm, a Ray proxy) carry it
            self._weights_hash = known if isinstance(known, str) else weights_hash(self.backend.model) if hasattr(self.backend, "model") else "unknown"
        return self._weights_hash

    def ledger(self) -> Ledger:
        return Ledger(self.backend.n_params)


def setup_run(cfg: RunConfig, method: str, backend: Backend | None = None, needs: Sequence[str] = ("support", "test")) -> RunContext:
    """Resolve task, splits, reward and run directory, checking the splits the method `needs` are
    non-empty before any model is loaded; `backend` injects a ready backend (tests, reuse)."""
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task, cfg.data)
    reward_fn = resolve_reward(cfg.reward)
    sizes = SplitSizes(cfg.n_support, cfg.n_probe, cfg.n_validation, cfg.n_test)
    splits = make_splits(task, sizes, cfg.split_seed)
    for split in needs:
        if not splits[split]:
            raise CorpError(f"the {split} split is empty but {method} needs it; set --n-{split} >= 1")
    run_dir = prepare_run_dir(cfg.run_dir, cfg.task, method, cfg.seed)
    if os.environ.get("CORP_NO_PROGRESS") != "1":
        tqdm.write(f"run directory: {run_dir}", file=sys.stderr)
    write_yaml(run_dir / "config.yaml", {"method": method, **config_to_dict(cfg)})
    write_json(run_dir / "splits.json", {"split_seed": cfg.split_seed, **{s: [e.id for e in splits[s]] for s in SPLITS}})
    return RunContext(cfg, method, task, splits, run_dir, reward_fn, backend)


def evaluate(ctx: RunContext, examples: Sequence[Example], direction: Direction | None = None, n: int = 1, temperature: float = 0.0) -> EvalResult:
    """Generate on `examples` with weights base + direction and score every completion."""
    ctx.backend.set_direction(direction)
    return evaluate_current(ctx, examples, n=n, temperature=temperature)


def evaluate_current(ctx: RunContext, examples: Sequence[Example], n: int = 1, temperature: float = 0.0) -> EvalResult:
    """Like `evaluate`, with the backend's weights as they are now."""
    gens = ctx.backend.generate([e.prompt for e in examples], ctx.max_new_tokens, temperature=temperature, n=n)
    exs = [e for e in examples for _ in range(n)]
    rewards, errors = compute_rewards(ctx.task, gens.texts, exs, ctx.reward_fn)
    answers = [ctx.task.extract(t) for t in gens.texts]
    correct = [ctx.task.check(a, e) for a, e in zip(answers, exs)] if ctx.reward_fn is not None else [r >= 1.0 for r in rewards]
    status = ctx.task.last_status_counts() if hasattr(ctx.task, "last_status_counts") else {}
    return EvalResult(gens.texts, answers, rewards, correct, sum(gens.prompt_tokens), sum(gens.generated_tokens), gens.seconds, errors, status)


def row_key(seed: int | None, sigma: float | None, split: str) -> str:
    return f"base:{split}" if seed is None else f"{int(seed)}:{float(sigma)!r}:{split}"


def result_row(seed: int | None, sigma: float | None, split: str, res: EvalResult, apply_seconds: float = 0.0, **extra) -> dict:
    return {
        "key": row_key(seed, sigma, split),
        "seed": seed,
        "sigma": sigma,
        "split": split,
        "reward": res.mean_reward,
        "accuracy": res.accuracy,
        "rewards": res.rewards,
        "correct": [int(c) for c in res.correct],
        "answers": res.answers,
        "prompt_tokens": res.prompt_tokens,
        "generated_tokens": res.generated_tokens,
        "seconds": res.seconds,
        "apply_seconds": apply_seconds,
        "reward_errors": res.reward_errors,
        "status_counts": res.status_counts,
        **extra,
    }


def population_meta(ctx: RunContext, split: str) -> dict:
    cfg = ctx.cfg
    return {
        "model": ctx.backend.model_id if hasattr(ctx.backend, "model_id") else cfg.model,
        "weights_hash": ctx.weights_hash,
        "task": ctx.task.signature(),
        "reward": cfg.reward or "correct",
        "split": split,
        "example_ids": [e.id for e in ctx.splits[split]],
        "noise_scheme": SCHEME_VERSION,
        "param_filter": {"include": getattr(cfg, "include", ".*"), "exclude": getattr(cfg, "exclude", "")},
        "max_new_tokens": ctx.max_new_tokens,
    }


def check_meta(path: Path, expected: dict, what: str) -> None:
    """Refuse to reuse rows written under a different model/task/split/filter."""
    if not path.exists():
        write_json(path, expected)
        return
    found = read_json(path)
    for key, value in expected.items():
        if found.get(key) != value:
            shown = value if key != "example_ids" else f"{len(value)} ids"
            was = found.get(key) if key != "example_ids" else f"{len(found.get(key) or [])} different ids"
            raise CorpError(f"{what} in '{path.parent}' was made with {key} = {was}, not {shown}; use another --run-dir (or matching options)")


def specialists_for(cfg: PopulationConfig) -> list[tuple[int, float]]:
    seeds = specialist_seeds(cfg.seed, cfg.population)
    return [(s, cfg.sigmas[i % len(cfg.sigmas)]) for i, s in enumerate(seeds)]


def score_one(ctx: RunContext, seed: int | None, sigma: float | None, split: str) -> dict:
    """Set the backend to specialist (seed, sigma) (None: the base), evaluate it on `split`, return its row.
    Every executor makes rows with this function."""
    t0 = time.perf_counter()
    ctx.backend.set_direction(None if seed is None else Direction.single(seed, sigma))
    apply_s = time.perf_counter() - t0
    res = evaluate_current(ctx, ctx.splits[split])
    return result_row(seed, sigma, split, res, apply_seconds=apply_s)


def score_specialists(ctx: RunContext, specialists: Sequence[tuple[int | None, float | None]], split: str, path: Path, desc: str = "scoring") -> dict[str, dict]:
    """Score each (seed, sigma) (None, None = the base) on `split`, appending rows to `path`; resumable.

    Returns {key: row} for the requested specialists. A progress bar shows specialists done, the best
    reward so far and the ETA.
    """
    examples = ctx.splits[split]
    if not examples:
        raise CorpError(f"the {split} split is empty; set --n-{split} >= 1")
    from corp.evaluate.executors import get_executor

    executor = get_executor(ctx)
    check_meta(path.with_name(path.stem + "_meta.json"), population_meta(ctx, split), path.name)
    done = {r["key"]: r for r in read_jsonl(path, key="key")}
    wanted = [(s, sg, row_key(s, sg, split)) for s, sg in specialists]
    todo = [w for w in wanted if w[2] not in done]
    best = max((done[k]["reward"] for *_, k in wanted if k in done), default=float("nan"))
    bar = tqdm(total=len(wanted), initial=len(wanted) - len(todo), desc=desc, unit="spec", dynamic_ncols=True, disable=os.environ.get("CORP_NO_PROGRESS") == "1")
    bar.set_postfix(best=f"{best:.3f}")
    try:
        for row in executor.map(ctx, [(s, sg) for s, sg, _ in todo], split):
            key = row["key"]
            append_jsonl(path, row)
            done[key] = row
            best = row["reward"] if best != best else max(best, row["reward"])
            if row["reward_errors"]:
                warnings.warn(f"{key}: reward failed on {row['reward_errors']} example(s); scored 0 and counted in the row")
            bar.set_postfix(best=f"{best:.3f}", last=f"{row['reward']:.3f}")
            bar.update(1)
    finally:
        bar.close()
        ctx.backend.set_direction(None)
    return {k: done[k] for *_, k in wanted}


def ensure_population(ctx: RunContext) -> list[dict]:
    """The scored population on the support split: reused from `--population-from`, else scored
    (or resumed) in this run directory. Rows come back ranked by reward, best first (ties: seed order)."""
    cfg = ctx.cfg
    if cfg.population_from:
        src = Path(cfg.population_from) / "population.jsonl"
        check_meta(src.with_name("population_meta.json"), population_meta(ctx, "support"), f"--population-from {src}")
        rows = [r for r in read_jsonl(src, key="key", repair=False) if r.get("split") == "support" and r.get("seed") is not None]
        if not rows:
            raise CorpError(f"--population-from '{cfg.population_from}' has no scored specialists")
        if len(rows) < cfg.population:
            warnings.warn(f"--population-from has {len(rows)} specialists, fewer than --population {cfg.population}; using them all")
    else:
        rows = list(score_specialists(ctx, specialists_for(cfg), "support", ctx.run_dir / "population.jsonl", desc="population").values())
    order = {r["key"]: i for i, r in enumerate(rows)}
    return sorted(rows, key=lambda r: (-r["reward"], order[r["key"]]))


def rows_ledger(ctx: RunContext, rows: Sequence[dict]) -> Ledger:
    """Tokens and FLOPs of the generations behind some result rows."""
    led = ctx.ledger()
    for r in rows:
        led.add_generation(r["prompt_tokens"], r["generated_tokens"])
    return led
