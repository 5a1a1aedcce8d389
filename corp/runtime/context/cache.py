"""The evaluation cache: `EvalCache` (a JSONL file of rows keyed by `eval_key`, optionally shared
between runs) and `cached_eval`, the one way a method gets an evaluation that is not a population row."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

from corp.algorithms.perturb import Direction
from corp.evaluate.tasks import Example
from corp.runtime.context.evaluation import evaluate_current
from corp.runtime.context.keys import direction_fingerprint, eval_identity, eval_key
from corp.runtime.context.rows import result_row, shareable
from corp.runtime.context.run_context import RunContext
from corp.runtime.runs import append_jsonl, read_jsonl, unique_rows

EVALS_FILE = "evals.jsonl"


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


def run_evals(ctx: RunContext) -> EvalCache:
    """The run's cache of every evaluation that is not a population row."""
    shared = getattr(ctx.cfg, "eval_cache", None)
    return EvalCache(ctx.run_dir / EVALS_FILE, shared=shared, salt=shared_salt(ctx) if shared else "")


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
