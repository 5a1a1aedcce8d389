"""Racing the population on the support split (`--race halving`): successive halving.

Successive halving: Jamieson & Talwalkar, "Non-stochastic Best Arm Identification and
Hyperparameter Optimization", AISTATS 2016, https://arxiv.org/abs/1502.07943 (Karnin et al. 2013
for the bandit version). Every specialist is scored on the first `race_first` support examples;
after each rung the best 1/eta of those still running (never fewer than `keep`, ties kept) go on
to eta times as many examples, until the survivors have seen the whole support split.

How corp departs from the paper's setting, and why:
- The budget is not fixed in advance; the rungs are fixed (race_first, race_first * eta, ...) and the
  survivors' count has a floor, `keep`: what the method that reads the population needs scored in
  full (RandOpt's largest K, CoRP's widest elite set).
- Selection is made exact after the race, not trusted to it: `complete_needed` scores any
  specialist the method would use (its top-K, its elites) that the race stopped, on the rest of the
  support split, until every specialist the method uses has a full-support row. So RandOpt's ranking
  and CoRP's weights use the same examples as an unraced run for every specialist they keep; the
  race only decides who is never looked at again. A stopped specialist keeps its partial mean
  (`raced` row), which still enters CoRP's elite quantile threshold; that is the one place a
  partial estimate is used.
- A survivor's full row is assembled from its chunk rows (the same examples, greedy, scored in
  smaller batches), under the key of a full-support row. The compute ledger counts each chunk once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from corp.errors import CorpError
from corp.runtime.context import TIMING_FIELDS, EvalCache, RunContext, eval_identity, eval_key, specialist_what
from corp.runtime.runs import unique_rows

RACED = "raced"  # kind of the row a stopped specialist leaves: its mean over the examples it saw
_SUM = ("prompt_tokens", "generated_tokens", "reward_errors", "truncated", *TIMING_FIELDS)
_CONCAT = ("rewards", "correct", "answers")


def rungs(n: int, first: int, eta: int) -> list[int]:
    """Cumulative example counts after each rung: first, first*eta, ... capped at n (always ends at n)."""
    if n < 1:
        raise CorpError("the support split is empty; set --n-support >= 1")
    out, c = [], max(1, min(first, n))
    while c < n:
        out.append(c)
        c = min(n, c * eta)
    return out + [n]


def survivors(means: dict[int, float], keep: int, eta: int, ties: str = "keep") -> list[int]:
    """Those still running after a rung: the best max(keep, ceil(len/eta)) by mean. `ties`: keep
    (every tie with the last kept goes on too; on coarse rewards, e.g. 1 of 8 right, a tie can hold
    most of the population) or order (exactly that many go on, ties broken by population order, as
    RandOpt's ranking breaks them)."""
    if len(means) <= keep:
        return sorted(means)
    n_keep = max(keep, math.ceil(len(means) / eta))
    if ties == "order":
        return sorted(sorted(means, key=lambda i: (-means[i], i))[:n_keep])
    cut = sorted(means.values(), reverse=True)[n_keep - 1]
    return sorted(i for i, m in means.items() if m >= cut)


def _chunk_split(ctx: RunContext, lo: int, hi: int) -> str:
    name = f"support[{lo}:{hi}]"
    ctx.splits[name] = ctx.splits["support"][lo:hi]
    return name


def _join(ctx: RunContext, parts: Sequence[dict], upto: int, kind: str, key_what: str, index: int) -> dict:
    """One row from consecutive chunk rows of a specialist covering support[0:upto]."""
    first = parts[0]
    ids = ctx.example_ids("support")[:upto]
    identity = eval_identity(ctx.eval_context(), key_what, ids)
    row = {
        k: v
        for k, v in first.items()
        if k not in _SUM + _CONCAT + ("key", "split", "ids_hash", "n_examples", "shared_from")
    }
    row.update({k: sum(p.get(k, 0) or 0 for p in parts) for k in _SUM})
    row.update({k: [x for p in parts for x in p[k]] for k in _CONCAT})
    row["status_counts"] = {
        s: sum((p.get("status_counts") or {}).get(s, 0) for p in parts)
        for s in set().union(*((p.get("status_counts") or {}) for p in parts))
    }
    row.update(
        key=eval_key(identity),
        kind=kind,
        what=specialist_what(first["seed"], first["sigma"]),
        split="support",
        ids_hash=identity["ids_hash"],
        n_examples=upto,
        index=index,
        reward=sum(row["rewards"]) / upto,
        accuracy=sum(row["correct"]) / upto,
        assembled_from=[p["split"] for p in parts],
    )
    return row


def _final_rows(
    ctx: RunContext,
    specs: Sequence[tuple[int, float]],
    cache: EvalCache,
    done: dict[int, dict],
    stopped: dict[int, dict],
    parts: dict[int, list[dict]],
    n: int,
) -> list[dict]:
    """The race's outcome in population order: each specialist's earlier full row, its raced row, or
    its survivor row assembled from its chunks; the new rows are cached in that order."""
    rows: list[dict] = []
    for i in range(len(specs)):
        if i in done:
            rows.append({**done[i], "index": i})
        elif i in stopped:
            rows.append(cache.put(stopped[i]))
        else:
            rows.append(cache.put(_join(ctx, parts[i], n, "specialist", specialist_what(*specs[i]), i)))
    return rows


def race_population(
    ctx: RunContext,
    specs: Sequence[tuple[int, float]],
    cache: EvalCache,
    keep: int,
    first: int,
    eta: int,
    score: Callable,
    ties: str = "keep",
) -> tuple[list[dict], dict]:
    """Race `specs` (population order) on the support split. Returns one row per specialist (a full
    `specialist` row for survivors, a `raced` row for the stopped) and a summary for the report.
    `score(ctx, specs, split, cache, desc, indices)` is scorer.score_specialists (passed in, not imported: no cycle)."""
    n = len(ctx.splits["support"])
    ids = ctx.example_ids("support")
    context = ctx.eval_context()
    full_keys = [eval_key(eval_identity(context, specialist_what(s, sg), ids)) for s, sg in specs]
    # scored in full earlier by an unraced run here; a row assembled by an earlier race is not:
    # this race is run again from its cached chunks, so it ends as a fresh race would
    done = {i: cache.get(k) for i, k in enumerate(full_keys) if k in cache and not cache.get(k).get("assembled_from")}
    parts: dict[int, list[dict]] = {i: [] for i in range(len(specs)) if i not in done}
    alive = sorted(parts)
    bounds = rungs(n, first, eta)
    lo, history = 0, []
    stopped: dict[int, dict] = {}
    for hi in bounds:
        if not alive:
            break
        split = _chunk_split(ctx, lo, hi)
        got = score(ctx, [specs[i] for i in alive], split, cache, desc=f"race {lo}:{hi}", indices=alive)
        for i in alive:
            parts[i].append(got[specs[i]])
        history.append({"examples": hi, "scored": len(alive)})
        if hi == n:
            break
        means = {i: sum(sum(p["rewards"]) for p in parts[i]) / hi for i in alive}
        for i in list(done):  # specialists already scored in full compete with their mean on the same prefix
            means[i] = sum(done[i]["rewards"][:hi]) / hi
        keep_now = set(survivors(means, keep, eta, ties))
        for i in alive:
            if i not in keep_now:
                stopped[i] = _join(ctx, parts[i], hi, RACED, specialist_what(*specs[i]) + "|raced", i)
        alive = [i for i in alive if i in keep_now]
        lo = hi
    rows = _final_rows(ctx, specs, cache, done, stopped, parts, n)
    summary = {
        "rule": "successive halving",
        "first": first,
        "eta": eta,
        "keep": keep,
        "ties": ties,
        "rungs": history,
        "stopped": len(stopped),
        "full": len(specs) - len(stopped),
    }
    return rows, summary


def complete_needed(
    ctx: RunContext, rows: list[dict], need: Callable[[list[dict]], Iterable[int]], cache: EvalCache, score: Callable
) -> list[dict]:
    """Score on the rest of the support split every stopped specialist that `need(rows)` (positions
    in `rows`) names, until it names only full rows (each pass completes at least one, so this
    ends). Returns the rows with those replaced, ranked (best first, ties in population order)."""
    rows = list(rows)
    n = len(ctx.splits["support"])
    while True:
        rows.sort(key=lambda r: (-r["reward"], r["index"]))  # `need` reads positions in the ranking
        todo = [j for j in sorted(set(need(rows))) if rows[j].get("kind") == RACED]  # positions in `rows`
        if not todo:
            return rows
        for j in todo:
            r = rows[j]
            seen = int(r["n_examples"])
            split = _chunk_split(ctx, seen, n)
            spec = (r["seed"], r["sigma"])
            rest = score(ctx, [spec], split, cache, desc="complete", indices=[r["index"]])[spec]
            head = {**r, "split": f"support[0:{seen}]"}
            rows[j] = cache.put(_join(ctx, [head, rest], n, "specialist", specialist_what(*spec), r["index"]))


def is_raced(rows: Sequence[dict]) -> bool:
    return any(r.get("kind") == RACED for r in rows)


def latest_rows(rows: Iterable[dict]) -> list[dict]:
    """Per specialist index: its full-support row if there is one, else its raced row with the most examples."""
    best: dict[int, dict] = {}
    for r in unique_rows(list(rows)).values():
        i = r["index"]
        old = best.get(i)
        if old is None or (
            old.get("kind") == RACED and (r.get("kind") != RACED or r["n_examples"] > old["n_examples"])
        ):
            best[i] = r
    return [best[i] for i in sorted(best)]
