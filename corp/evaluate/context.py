"""The run layer: the run context, opening a run, and the one evaluation cache every method uses.

Every method imports its run layer from here and only from here: `open_run` / `setup_run` (resolve
task, splits and reward, lock the run directory, refuse a directory made under another definition
(`population_definition`, `check_meta`) before writing anything), `RunContext`, `EvalCache`,
`cached_eval` and `run_evals`. Scoring a population of specialists is `scorer.py`, above this.

`RunContext` carries a run's resolved config, task, splits, run directory, reward and (lazily) its
backend and executor. `evaluate` / `evaluate_current` generate on some examples and score them.

The evaluation cache (`EvalCache` + `cached_eval`): every cached evaluation of every method is a row
of one schema (`result_row`) in a JSONL file, keyed by a hash of everything that defines it
(`eval_identity`): the model id and its weights hash, the backend, the task signature (including
the content hash of file-backed data), the reward, the exact example ids (a hash of the ordered id
list), what was evaluated (`what`: "base", the fingerprint of a direction's seed components, or a
method's checkpoint label), and the generation settings (max_new_tokens, temperature, n; for a
sampled evaluation also the sampling seed and the version of its derivation, `SAMPLING`). A lookup
with other examples, weights or settings is another key, so it is evaluated afresh: a row is never
paired with examples it was not computed on. `cached_scores` returns per-example rewards as a
`corp.stats.PerExample` carrying those ids, which the paired gate checks.

Seeded sampling (`sampling_seeds`): a sampled evaluation (temperature > 0: self-consistency,
`corp eval`'s pass@k) gives example e of the evaluation of `what` the prompt seed
sha256("corp-eval-sample", run seed, what, e's id) (63 bits), and its completion j is drawn from
`completion_seed(prompt seed, j)` (corp.evaluate.backends.base). So a sample depends on the run's
`--seed`, the model evaluated and the example, never on the batch it shared or on the order a
resumed run evaluates in; the seed is part of the row's key, so rows of two seeds never mix.

This module sits below `scorer.py` and `executors.py` (both import it; it imports neither), so the
executors no longer need to import the scorer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from corp import CorpError
from corp.config import PopulationConfig, RunConfig, config_to_dict
from corp.evaluate.backends import Backend, make_backend
from corp.evaluate.rewards import compute_rewards, resolve_reward, reward_identity
from corp.evaluate.tasks import SPLITS, Example, SplitSizes, Task, dev_pool, get_task, make_splits
from corp.ledger import Ledger
from corp.models import check_model_reachable
from corp.perturb import SCHEME_VERSION, Direction, ParamFilter, scheme_from_flag
from corp.runs import (
    RunLock,
    append_jsonl,
    finish_run_dir,
    open_run_dir,
    read_json,
    read_jsonl,
    unique_rows,
    write_failure,
    write_json,
    write_status,
    write_yaml,
)
from corp.stats import PerExample

POPULATION_FILE = "population.jsonl"
META_FILE = "population_meta.json"
EVALS_FILE = "evals.jsonl"
META_FORMAT = 2
POPULATION_ORDER = "specialist i = (specialist_seeds(seed)[i], sigmas[i % len(sigmas)])"
SAMPLING = "corp-sample-v1"  # the derivation of sampled evaluations' seeds (module docstring); in their keys
ROW_FORMAT = 2  # rows keyed by eval_identity (format 1: "<seed>:<sigma>:<split>" keys, no example ids)


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
    """Everything a command needs: resolved config, task, splits, backend, reward, run directory.

    The backend is built on first use from the config unless one is given (`set_backend`);
    `release_backend` drops it (e.g. to free memory). `executor` is where population scoring runs
    (corp.evaluate.executors.get_executor sets it). `close()` releases the run-directory lock.
    """

    cfg: RunConfig
    method: str
    task: Task
    splits: dict[str, list[Example]]
    run_dir: Path | None
    reward_fn: Callable | None
    _backend: Backend | None = None
    _weights_hash: str | None = None
    executor: object | None = None
    created: bool = False  # this invocation created run_dir (a failure that computed nothing removes it)
    lock: RunLock | None = None
    definition: dict | None = None  # what defines the population rows written here (population_definition)
    population_source: dict | None = None  # where the population came from and which rows were taken (for the report)
    live: object | None = None  # corp.tracking.LiveLog under --report-to (open_run sets it)

    def log_row(self, path: str | Path, row: dict) -> None:
        """Append a metrics row (metrics.jsonl, rounds.jsonl) and hand it to `--report-to` live."""
        append_jsonl(path, row)
        if self.live is not None:
            self.live.log(path, row)

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            pf = ParamFilter(getattr(self.cfg, "include", ".*"), getattr(self.cfg, "exclude", ""))
            self._backend = make_backend(
                self.cfg.backend,
                self.cfg.model,
                self.cfg.device,
                self.cfg.dtype,
                self.cfg.batch_size,
                pf,
                self.noise_scheme,
                engine_options(self.cfg),
            )
        return self._backend

    @property
    def noise_scheme(self) -> str:
        """The run's noise scheme (`--noise`; full-rank when the config has none)."""
        return run_scheme(self.cfg)

    def has_backend(self) -> bool:
        return self._backend is not None

    def set_backend(self, backend: Backend) -> None:
        """Use this backend (a ready one, or a proxy such as the Ray executor's) from now on."""
        self._backend = backend

    def release_backend(self) -> None:
        """Drop the backend (the next use builds a new one)."""
        self._backend = None

    @property
    def max_new_tokens(self) -> int:
        return self.cfg.max_new_tokens or self.task.max_new_tokens

    @property
    def model_id(self) -> str:
        return self.backend.model_id or self.cfg.model  # None: an in-memory model, named by --model

    @property
    def weights_hash(self) -> str:
        if self._weights_hash is None:
            self._weights_hash = self.backend.weights_hash
        return self._weights_hash

    def example_ids(self, split: str) -> list[str]:
        return [e.id for e in self.splits[split]]

    def ledger(self) -> Ledger:
        return Ledger(self.backend.n_params)

    def eval_context(self) -> dict:
        """The parts of an evaluation's identity that are the same for every row of this run."""
        return {
            "model": self.model_id,
            "weights_hash": self.weights_hash,
            "backend": self.backend.name,
            "task": self.task.signature(),
            "reward": reward_identity(self.cfg.reward),
            "max_new_tokens": self.max_new_tokens,
            # another scheme's seeds are other weights; the full-rank default stays out of the key so
            # that rows cached before schemes were selectable keep their keys
            **({"noise_scheme": self.noise_scheme} if self.noise_scheme != SCHEME_VERSION else {}),
        }

    def close(self) -> None:
        ex, self.executor = self.executor, None
        if ex is not None:  # a Ray executor stops the actors and the local Ray it started
            if getattr(self._backend, "executor", None) is ex:
                self._backend.close()  # the driver's proxy to those actors (and its host copy)
                self._backend = None
            ex.close()
        if self.lock is not None:
            self.lock.release()


def run_scheme(cfg) -> str:
    """The noise scheme a config's `--noise` names (the current full-rank scheme without one)."""
    return scheme_from_flag(getattr(cfg, "noise", None))


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


def sampling_seeds(run_seed: int, what: str, ids: Sequence[str]) -> list[int]:
    """The prompt seeds of a sampled evaluation of `what` on examples `ids` (module docstring)."""
    out = []
    for i in ids:
        digest = hashlib.sha256("\x1f".join(("corp-eval-sample", str(int(run_seed)), what, str(i))).encode()).digest()
        out.append(int.from_bytes(digest[:8], "little") >> 1)
    return out


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
    rewards, errors = compute_rewards(ctx.task, gens.texts, exs, ctx.reward_fn)
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
    )


# ----------------------------------------------------------------------------- keys


def ids_hash(ids: Sequence[str]) -> str:
    """A hash of an ordered list of example ids (order matters: rows are per-example lists)."""
    return hashlib.sha256("\x1f".join(map(str, ids)).encode()).hexdigest()[:16]


def direction_fingerprint(direction: Direction | None) -> str:
    """'base', or a hash of the direction's seed components (what it is, not how it was found)."""
    if direction is None or direction.is_zero():
        return "base"
    return "dir:" + hashlib.sha256(json.dumps(direction.to_json(), sort_keys=True).encode()).hexdigest()[:16]


def specialist_what(seed: int | None, sigma: float | None) -> str:
    return "base" if seed is None else direction_fingerprint(Direction.single(int(seed), float(sigma)))


def eval_identity(
    context: dict, what: str, ids: Sequence[str], n: int = 1, temperature: float = 0.0, seed: int | None = None
) -> dict:
    """Everything that defines one evaluation (see the module docstring). A sampled one
    (temperature > 0) needs the run's `seed`; a greedy one's key does not hold it, so greedy rows
    are shared between seeds."""
    identity = {
        **context,
        "what": what,
        "ids_hash": ids_hash(ids),
        "n_examples": len(ids),
        "temperature": float(temperature),
        "n": int(n),
    }
    if temperature > 0:
        if seed is None:
            raise ValueError("a sampled evaluation's identity needs the run's seed")
        identity.update(sample_seed=int(seed), sampling=SAMPLING)
    return identity


def eval_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------- rows and the cache


def result_row(
    identity: dict,
    split: str,
    res: EvalResult,
    kind: str,
    seed: int | None = None,
    sigma: float | None = None,
    apply_seconds: float = 0.0,
    **extra,
) -> dict:
    """The one row schema of every cached evaluation (population rows included)."""
    return {
        "key": eval_key(identity),
        "format": ROW_FORMAT,
        "kind": kind,  # specialist | base | direction | checkpoint | es-specialist | es-centre | ...
        "what": identity["what"],
        "split": split,
        "seed": seed,
        "sigma": sigma,
        "ids_hash": identity["ids_hash"],
        "n_examples": identity["n_examples"],
        "temperature": identity["temperature"],
        "n": identity["n"],
        **({"sample_seed": identity["sample_seed"]} if "sample_seed" in identity else {}),
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
        "identity": {
            k: identity[k]
            for k in ("model", "weights_hash", "backend", "task", "reward", "max_new_tokens")
            if k in identity
        },
        **extra,
    }


# Rows another run may reuse: greedy evaluations of the base or of seed-defined directions. A
# checkpoint's `what` is a label its own run chose ("es-centre@4"), and sampled rows depend on the
# run's sampling seed, so neither leaves its run.
_SHAREABLE_WHAT = re.compile(r"^(base|dir:[0-9a-f]+)$")


def shareable(row: dict) -> bool:
    return (
        float(row.get("temperature", 0.0)) == 0.0
        and bool(_SHAREABLE_WHAT.match(str(row.get("what", ""))))
        and row.get("kind") != "checkpoint"
    )


class EvalCache:
    """A JSONL file of evaluation rows keyed by `eval_key`; appends are durable; duplicates collapse
    to the first row with a key (so a row never counts twice).

    `shared`: a second JSONL file that several runs read and write (`--eval-cache`; corp bench keeps
    one per task, so the base model's test evaluation and a specialist's evaluation chosen by
    several cells run once). Only `shareable` rows go there, under a key salted with `salt` (what
    the run's key leaves implicit because it is fixed within a run: noise scheme, perturbed
    parameters, dtype, device). A row found there is copied into this run's file, marked
    `shared_from`, so the run directory stays complete on its own."""

    def __init__(self, path: str | Path, shared: str | Path | None = None, salt: str = ""):
        self.path = Path(path)
        self.rows: dict[str, dict] = unique_rows(read_jsonl(self.path, key="key"))
        self.shared = EvalCache(shared) if shared else None
        self.salt = salt

    def _shared_key(self, key: str) -> str:
        return hashlib.sha256(f"{key}|{self.salt}".encode()).hexdigest()[:32]

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, key: str) -> dict | None:
        row = self.rows.get(key)
        if row is None and self.shared is not None:
            found = self.shared.get(self._shared_key(key))
            if found is not None:
                row = {**found, "key": key, "shared_from": str(self.shared.path)}
                append_jsonl(self.path, row)
                self.rows[key] = row
        return row

    def put(self, row: dict) -> dict:
        """Append `row` unless its key is cached already; returns the cached row."""
        if row["key"] not in self.rows:
            append_jsonl(self.path, row)
            self.rows[row["key"]] = row
            if self.shared is not None and shareable(row):
                self.shared.put({**row, "key": self._shared_key(row["key"])})
        return self.rows[row["key"]]


def cached_eval(
    ctx: RunContext,
    cache: EvalCache,
    split: str,
    direction: Direction | None = None,
    *,
    what: str | None = None,
    current: bool = False,
    kind: str | None = None,
    examples: Sequence[Example] | None = None,
    n: int = 1,
    temperature: float = 0.0,
    **extra,
) -> dict:
    """The cached row of one evaluation on `split` (or on `examples`, named `split`), computing it if needed.

    `direction`: evaluate base + direction. `current=True`: evaluate the backend's weights as they
    are (a trained checkpoint, an ES centre); then `what` must name them. `extra` fields go into a
    new row (they are not part of the key)."""
    exs = list(ctx.splits[split] if examples is None else examples)
    if current and not what:
        raise ValueError("an evaluation of the current weights needs `what` (a checkpoint label)")
    what = what or direction_fingerprint(direction)
    identity = eval_identity(
        ctx.eval_context(), what, [e.id for e in exs], n=n, temperature=temperature, seed=ctx.cfg.seed
    )
    key = eval_key(identity)
    row = cache.get(key)
    if row is None:
        t0 = time.perf_counter()
        if not current:
            ctx.backend.set_direction(direction)
        apply_s = time.perf_counter() - t0
        res = evaluate_current(ctx, exs, n=n, temperature=temperature, what=what)
        kind = kind or ("checkpoint" if current else "base" if what == "base" else "direction")
        row = cache.put(result_row(identity, split, res, kind, apply_seconds=apply_s, **extra))
    return row


def row_scores(row: dict, ids: Sequence[str], field_name: str = "rewards") -> PerExample:
    """A row's per-example values as a PerExample with the ids they were computed on (checked)."""
    if row.get("ids_hash") != ids_hash(ids):
        raise ValueError(f"row {row.get('key')} was computed on other examples than the {len(ids)} given")
    return PerExample(row[field_name], ids)


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


def population_definition(cfg: RunConfig, task, splits, max_new_tokens: int, kind: str = "population", **more) -> dict:
    """What defines the rows of a population, as far as the config tells (the model's weights hash
    and id are added once it is loaded)."""
    return {
        "format": META_FORMAT,
        "kind": kind,  # population (RandOpt/CoRP: noise around the base) | es (noise around a moving centre)
        "model_name": cfg.model,
        "task": task.signature(),
        "reward": reward_identity(cfg.reward),
        "split": "support",
        "example_ids": [e.id for e in splits["support"]],
        "max_new_tokens": max_new_tokens,
        "noise_scheme": run_scheme(cfg),
        "param_filter": {"include": getattr(cfg, "include", ".*"), "exclude": getattr(cfg, "exclude", "")},
        "seed": cfg.seed,
        **more,
    }


def default_definition(cfg: RunConfig, task, splits, max_new_tokens: int) -> dict | None:
    if isinstance(cfg, PopulationConfig) and not cfg.from_run:
        return population_definition(
            cfg, task, splits, max_new_tokens, sigmas=[float(s) for s in cfg.sigmas], order=POPULATION_ORDER
        )
    return None


def compare_meta(found: dict, expected: dict, where: Path, what: str, keys: Sequence[str] | None = None) -> None:
    """Refuse when `found` (a stored meta) disagrees with `expected` on any of `keys` (default: all of expected)."""
    for key in keys if keys is not None else expected:
        if key not in expected:
            continue
        value = expected[key]
        if found.get(key) != value:
            shown = value if key != "example_ids" else f"{len(value)} ids"
            was = found.get(key) if key != "example_ids" else f"{len(found.get(key) or [])} different ids"
            raise CorpError(
                f"{what} in '{where}' was made with {key} = {was}, not "
                f"{shown}; use another --output-dir (or matching options)"
            )


def check_meta(path: Path, expected: dict, what: str) -> None:
    """Refuse to reuse rows written under a different definition; write the meta if there is none."""
    if not path.exists():
        write_json(path, expected)
        return
    found = read_json(path)
    if found.get("format") != expected.get("format"):
        raise CorpError(
            f"{what} in '{path.parent}' was written by an older corp "
            "(rows not keyed by their examples); use another --output-dir"
        )
    compare_meta(found, expected, path.parent, what)


def setup_run(
    cfg: RunConfig,
    method: str,
    backend: Backend | None = None,
    needs: Sequence[str] = ("support", "test"),
    defines: dict | None | str | Callable = "auto",
) -> RunContext:
    """Resolve task, splits, reward and run directory; lock the directory; check that a reused
    directory was made under the same definition (`defines`: what the rows written here mean, or a
    function (task, splits, max_new_tokens) -> that; "auto": a population's definition for
    population configs) BEFORE writing anything; then write
    config.yaml and splits.json. `backend` injects a ready backend (tests, reuse)."""
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task, cfg.data)
    reward_fn = resolve_reward(cfg.reward)
    sizes = SplitSizes(cfg.n_support, cfg.n_probe, cfg.n_validation, cfg.n_test)
    splits = make_splits(task, sizes, cfg.split_seed)
    if cfg.report_on == "validation":
        # a hyperparameter trial: every row a method reports on "test" is computed on validation
        # instead, and the test examples are not evaluated at all
        splits["test"] = list(splits["validation"])
    elif cfg.report_on == "dev":
        # a hyperparameter trial on the task's development pool (heldout=START,dev=N): disjoint from
        # every selection split and from test, whatever the split sizes
        splits["test"] = dev_pool(task, cfg.task)
    for split in needs:
        if not splits[split]:
            raise CorpError(f"the {split} split is empty but {method} needs it; set --n-{split} >= 1")
    max_new = cfg.max_new_tokens or task.max_new_tokens
    if defines == "auto":
        defines = default_definition(cfg, task, splits, max_new)
    elif callable(defines):
        defines = defines(task, splits, max_new)
    if backend is None:  # a model that cannot be had is its error line before any run directory is announced
        check_model_reachable(cfg.model)
    run_dir, created = open_run_dir(cfg.run_dir, cfg.task, method, cfg.seed)
    lock = RunLock(run_dir)
    try:
        lock.acquire()
        if defines is not None and (run_dir / META_FILE).exists():
            found = read_json(run_dir / META_FILE)
            if found.get("format") != META_FORMAT:
                raise CorpError(
                    f"the population in '{run_dir}' was written by an older corp "
                    "(rows not keyed by their examples); use another --output-dir"
                )
            compare_meta(found, defines, run_dir, POPULATION_FILE)
        if os.environ.get("CORP_NO_PROGRESS") != "1":
            tqdm.write(f"run directory: {run_dir}", file=sys.stderr)
        # inside the try: a full disk here leaves no half-set-up directory this call created
        write_yaml(run_dir / "config.yaml", {"method": method, **config_to_dict(cfg)})
        write_json(
            run_dir / "splits.json",
            {
                "split_seed": cfg.split_seed,
                "report_on": cfg.report_on,
                **{s: [e.id for e in splits[s]] for s in SPLITS},
            },
        )
        write_status(run_dir, "running", method=method)
    except BaseException as exc:
        lock.release()
        if created:
            finish_run_dir(run_dir, created, exc if isinstance(exc, OSError) else RuntimeError("refused"))
        raise
    return RunContext(
        cfg, method, task, splits, run_dir, reward_fn, backend, created=created, lock=lock, definition=defines
    )


@contextmanager
def open_run(
    cfg: RunConfig,
    method: str,
    backend: Backend | None = None,
    needs: Sequence[str] = ("support", "test"),
    defines: dict | None | str | Callable = "auto",
) -> Iterator[RunContext]:
    """`setup_run` for the length of a method's run: on success the run is marked complete; on an
    error a directory this call created that holds nothing computed is removed, any other is marked
    FAILED (or interrupted); the lock is released either way. A SIGTERM (a job scheduler, `timeout`)
    is turned into an interrupt while the run is open, so it is recorded like Ctrl-C (SIGKILL cannot be)."""
    ctx = setup_run(cfg, method, backend, needs, defines)
    from corp.tracking import LiveLog, parse_report_to

    if parse_report_to(getattr(cfg, "report_to", "none")):
        ctx.live = LiveLog(ctx.run_dir, cfg.report_to, {"method": method, **config_to_dict(cfg)})
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    exported = False
    try:
        yield ctx
        # a full disk while writing the card or the event files fails the run like any other write
        # (what was computed stays; a rerun with --output-dir writes them without recomputing)
        _card(ctx)
        exported = True
        _report_to(ctx, fail_on_write=True)
    except BaseException as exc:
        finish_run_dir(ctx.run_dir, ctx.created, exc)
        if not exported:
            _report_to(ctx)  # a failed run's logged steps too; the run's own error is the one reported
        raise
    else:
        finish_run_dir(ctx.run_dir, ctx.created, None)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        ctx.close()


def _write_failed(what: str, where, exc: BaseException, ctx: RunContext) -> CorpError:
    """One line for a write the machine refused (a full disk or quota, a read-only place), naming the path."""
    path = getattr(exc, "filename", None) or where
    return CorpError(
        f"could not write {what} '{path}' ({write_failure(exc)}); free some space, then rerun with "
        f"--output-dir {ctx.run_dir} (nothing computed is lost)"
    )


def _card(ctx: RunContext) -> None:
    """The model card of `RUN_DIR/model`, when the run saved one (the one place run models get it)."""
    from corp.cards import run_model_card

    try:
        run_model_card(
            ctx.run_dir,
            ctx.method,
            {"method": ctx.method, **config_to_dict(ctx.cfg)},
            ctx.model_id,
            ctx._weights_hash,
            ctx.splits,
        )
    except Exception as exc:  # noqa: BLE001 -- model and report are written; only a full disk fails the run
        if write_failure(exc) is not None:
            raise _write_failed("the model card", ctx.run_dir / "model", exc, ctx) from None
        warnings.warn(f"model card for '{ctx.run_dir / 'model'}' not written: {type(exc).__name__}: {exc}")


def _report_to(ctx: RunContext, fail_on_write: bool = False) -> None:
    """--report-to at the end of a run, whether it completed or not: the live writers closed, or,
    when no row went to them live (nothing new written, or a backend failed), the run's record
    exported to TensorBoard / W&B."""
    from corp.tracking import export_run_metrics, parse_report_to

    live, ctx.live = ctx.live, None
    try:
        if live is not None and live.started:
            live.close()
            return
        if live is not None:
            live.close()
        config = {"method": ctx.method, **config_to_dict(ctx.cfg)}
        read = export_run_metrics(ctx.run_dir, getattr(ctx.cfg, "report_to", "none"), config)
        if fail_on_write and not read and parse_report_to(getattr(ctx.cfg, "report_to", "none")):
            warnings.warn(
                f"--report-to {ctx.cfg.report_to}: corp {ctx.method} logged no metrics in this run, so nothing was "
                "written (specialists scored here, es iterations, grpo and ftis steps, fgrpo and fera rounds are logged)"
            )
    except Exception as exc:  # noqa: BLE001 -- the JSONL record is written; a failing tracker must not hide the outcome
        if fail_on_write and write_failure(exc) is not None:
            raise _write_failed(f"--report-to {ctx.cfg.report_to}'s files", ctx.run_dir, exc, ctx) from None
        warnings.warn(f"--report-to {ctx.cfg.report_to}: metrics not exported: {type(exc).__name__}: {exc}")


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt("terminated (SIGTERM)")


def run_evals(ctx: RunContext) -> EvalCache:
    """The run's cache of every evaluation that is not a population row."""
    shared = getattr(ctx.cfg, "eval_cache", None)
    return EvalCache(ctx.run_dir / EVALS_FILE, shared=shared, salt=shared_salt(ctx) if shared else "")


def engine_options(cfg) -> dict:
    """The vLLM engine's options from a run's config (the hf backend takes none)."""
    return {
        "tensor_parallel_size": getattr(cfg, "tensor_parallel_size", 1),
        "gpu_memory_utilization": getattr(cfg, "gpu_memory_utilization", None),
        "enforce_eager": getattr(cfg, "enforce_eager", False) or None,
    }


def shared_salt(ctx: RunContext) -> str:
    """What an evaluation row's key leaves implicit because a run fixes it, for rows shared between runs."""
    cfg = ctx.cfg
    # the run's scheme (the one its backend materialises), read from the config rather than from
    # `backend.perturber`, which a vLLM backend lacks (and `--backend auto` would switch to hf for)
    return json.dumps(
        {
            "scheme": ctx.noise_scheme,
            "include": getattr(cfg, "include", ".*"),
            "exclude": getattr(cfg, "exclude", ""),
            "dtype": cfg.dtype,
            "device": cfg.device,
            # vLLM without graph compilation may round differently; only when set, so earlier keys stay
            **({"enforce_eager": True} if getattr(cfg, "enforce_eager", False) else {}),
        },
        sort_keys=True,
    )
