"""Scoring: score a population of specialists, reuse one from another run (the run itself is
opened by `corp.runtime.context.open_run`).

The population contract (docs/architecture.md, "Population"): `population.jsonl` holds one row per scored
specialist (the row schema of `corp.runtime.context.result_row`, kind "specialist", with its
`index` in population order), appended and fsynced per specialist, so a kill loses at most the
specialist in flight and a rerun on the same run directory skips what is done.
`population_meta.json` records everything that defines the rows: the population kind, model id and
weights hash, backend, task signature, reward, support ids, generation length, noise scheme,
parameter filter, master seed and sigmas (which fix the population order). `setup_run` (corp/runtime/context/lifecycle.py) compares
the part known from the config before it writes anything (a refused resume leaves config.yaml and
splits.json as they were); the rest is compared once the model is loaded, before any row is
written. Reusing a run directory under another definition is an error, never a silent mix.

Every other evaluation of a run (test rows, CoRP's probe/validation rows, ES and GRPO checkpoints)
goes to `evals.jsonl` through the same cache (`EvalCache`, `cached_eval`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from corp.algorithms.perturb import specialist_seeds
from corp.config import PopulationConfig, in_scales
from corp.errors import CorpError
from corp.evaluate import racing
from corp.evaluate.calibration import CALIBRATION_FILE, RULE, calibrate_sigmas, charge, is_auto
from corp.evaluate.racing import RACED, latest_rows
from corp.evaluate.rewards import IN_PROCESS
from corp.runtime.context import (
    META_FILE,
    META_FORMAT,
    POPULATION_FILE,
    EvalCache,
    RunContext,
    check_meta,
    compare_meta,
    default_definition,
    eval_identity,
    eval_key,
    run_evals,
    specialist_what,
)
from corp.runtime.executors import get_executor
from corp.runtime.ledger import Ledger, say_expected
from corp.runtime.progress import progress_disabled
from corp.runtime.runs import read_json, read_jsonl, unique_rows

_LEGACY_KEY = re.compile(r"^-?\d+:[^:]+:support$")


def specialists_for(cfg: PopulationConfig, sigmas: Sequence[float] | None = None) -> list[tuple[int, float]]:
    """The population's (seed, sigma) in order; `sigmas`: the grid (default the config's, which must then name one)."""
    grid = cfg.sigmas if sigmas is None else sigmas
    if is_auto(grid):
        raise CorpError("--sigmas auto is chosen when the population is scored (ensure_population); pass --sigmas")
    seeds = specialist_seeds(cfg.seed, cfg.population)
    return [(s, grid[i % len(grid)]) for i, s in enumerate(seeds)]


def population_meta(ctx: RunContext) -> dict:
    """The full definition of this run's population (config part + the loaded model's identity); under a
    calibrated noise scale `noise_scales` adds the rule and the value it chose."""
    base = ctx.definition or default_definition(ctx.cfg, ctx.task, ctx.splits, ctx.max_new_tokens)
    if base is None:
        raise CorpError(f"{ctx.method} does not score a population in its run directory")
    return {**base, **ctx.eval_context()}


def noise_scales(ctx: RunContext, option: str = "sigmas") -> tuple[list[float] | float, dict | None]:
    """The run's noise scales (`option` "sigmas": a population's grid; "sigma": ES's one scale, sigma*) and the
    calibration that chose them (None: fixed by --sigmas / --sigma), with population_meta.json checked (written
    on a first run; the calibrated value is recorded as `calibrated_<option>`). Under auto the meta is compared
    before the calibration generates anything (another model, backend or rule is refused first); a resumed run
    whose meta already holds its calibrated value reads calibration.json (nothing is generated); otherwise
    corp.evaluate.calibration runs, its rows cached in calibration.jsonl. Call it before the engine's weights
    move: the calibration specialists are noise around the base."""
    fixed, path = getattr(ctx.cfg, option), ctx.run_dir / META_FILE
    meta = population_meta(ctx)
    if not is_auto(fixed):
        check_meta(path, meta, POPULATION_FILE)
        return (float(fixed) if option == "sigma" else [float(s) for s in fixed]), None
    meta["calibration"] = RULE
    found = read_json(path) if path.exists() else {}
    if found:  # another model, backend or rule: refused before any calibration row is generated
        compare_meta(found, meta, ctx.run_dir, POPULATION_FILE)
    key = f"calibrated_{option}"
    if key in found and (ctx.run_dir / CALIBRATION_FILE).exists():
        cal = read_json(ctx.run_dir / CALIBRATION_FILE)
    else:
        cal = calibrate_sigmas(ctx, score_specialists, option=option)
    value = float(cal["sigma"]) if option == "sigma" else [float(s) for s in cal["sigmas"]]
    check_meta(path, {**meta, key: value}, POPULATION_FILE)
    return value, cal


def score_specialists(
    ctx: RunContext,
    specialists: Sequence[tuple[int | None, float | None]],
    split: str,
    cache: EvalCache,
    desc: str = "scoring",
    indices: Sequence[int] | None = None,
) -> dict[tuple, dict]:
    """Score each (seed, sigma) (None, None = the base) on `split` through the run's executor, adding
    rows to `cache`; resumable. `indices` (population order) go into the rows as `index`.

    Returns {(seed, sigma): row}. A progress bar shows specialists done, the best reward so far and the ETA.
    """
    examples = ctx.splits[split]
    if not examples:
        raise CorpError(f"the {split} split is empty; set --n-{split} >= 1")
    executor = get_executor(ctx)
    context = ctx.eval_context()
    ids = [e.id for e in examples]
    wanted = [((s, sg), eval_key(eval_identity(context, specialist_what(s, sg), ids))) for s, sg in specialists]
    index_of = {spec: i for spec, i in zip(specialists, indices)} if indices is not None else {}
    todo = [spec for spec, key in wanted if key not in cache]
    keys = dict(wanted)
    best = max((cache.get(k)["reward"] for _, k in wanted if k in cache), default=float("nan"))
    bar = tqdm(
        total=len(wanted),
        initial=len(wanted) - len(todo),
        desc=desc,
        unit="spec",
        dynamic_ncols=True,
        disable=progress_disabled(),
    )
    bar.set_postfix(best=f"{best:.3f}")
    try:
        for n, row in enumerate(executor.map(ctx, todo, split)):
            if n == 0:  # what the rest will take, at the rate of the first (the bar's ETA is gone with the bar)
                unit = "specialists" if all(s is not None for s, _ in todo) else "models"
                spent = row["seconds"] + row.get("apply_seconds", 0.0) + row.get("reward_seconds", 0.0)
                say_expected(desc, len(todo) - 1, unit, spent, getattr(executor, "workers", 1))
            spec = (row["seed"], row["sigma"])
            if row["key"] != keys.get(spec):
                raise CorpError(
                    f"specialist {spec} was scored under another model/task/setting "
                    "than this run's (worker and driver disagree)"
                )
            if spec in index_of:
                row["index"] = index_of[spec]
            cache.put(row)
            live = getattr(ctx, "live", None)
            if live is not None:  # --report-to: each specialist of the population as it is scored
                live.log(cache.path, row)
            best = row["reward"] if best != best else max(best, row["reward"])
            if row["reward_errors"]:
                warnings.warn(
                    f"specialist {spec}: reward failed on {row['reward_errors']} "
                    "example(s); scored 0 and counted in the row"
                )
            bar.set_postfix(best=f"{best:.3f}", last=f"{row['reward']:.3f}")
            bar.update(1)
    finally:
        bar.close()
        ctx.backend.set_direction(None)
    return {spec: cache.get(key) for spec, key in wanted}


def load_population(src_dir: str | Path, ctx: RunContext, n: int) -> tuple[list[dict], dict]:
    """The first `n` specialists, in population order, of the population scored in `src_dir`,
    after checking it was made for this run's model, task, support examples and generation settings.
    Returns (rows, how: a dict for the report saying what was taken)."""
    src = Path(src_dir)
    found, what = _check_source(src)
    expected = {
        **ctx.eval_context(),
        "example_ids": ctx.example_ids("support"),
        "noise_scheme": ctx.noise_scheme,
        "split": "support",
        "param_filter": {"include": getattr(ctx.cfg, "include", ".*"), "exclude": getattr(ctx.cfg, "exclude", "")},
    }
    rows = read_jsonl(src / POPULATION_FILE, key="key", repair=False)
    if found.get("format") == META_FORMAT:
        compare_meta(found, expected, src, what)

        rows = latest_rows(
            r for r in rows if r.get("kind") in ("specialist", RACED) and r.get("split") == "support"
        )  # latest_rows drops duplicate keys
        rule = "first in population order (specialist index)"
    else:
        rows, rule = _legacy_rows(rows, found, expected, src, what)
    if not rows:
        raise CorpError(f"--from-run '{src}' has no scored specialists")
    wanted = getattr(ctx.cfg, "from_sigmas", None)
    if wanted is not None:
        rows, rule = _of_sigmas(rows, wanted, src, rule)
    available = len(rows)
    if available < n:
        warnings.warn(f"--from-run has {available} specialists, fewer than --population {n}; using them all")
    elif available > n:
        warnings.warn(f"--from-run has {available} specialists; using the {n} {rule} (--population {n})")
    used = rows[:n]
    how = {
        "from": str(src),
        "available": available,
        "used": len(used),
        "rule": rule,
        "seed": found.get("seed"),
        "sigmas": found.get("calibrated_sigmas") or found.get("sigmas"),
    }
    if wanted is not None:
        how["from_sigmas"] = wanted
    if is_auto(found.get("sigmas")) and (src / CALIBRATION_FILE).exists():
        how["calibration"] = read_json(src / CALIBRATION_FILE)  # its scales were bought with it: charged here too
    return used, how


def _check_source(src: Path) -> tuple[dict, str]:
    """--from-run's directory holds a population with its meta, of kind population: (meta, what)."""
    meta_path = src / META_FILE
    if not (src / POPULATION_FILE).exists():
        raise CorpError(f"--from-run '{src}' has no {POPULATION_FILE}")
    if not meta_path.exists():
        raise CorpError(
            f"--from-run '{src}' has no {META_FILE}, so what its rows mean "
            "cannot be checked; score the population again with this corp"
        )
    found = read_json(meta_path)
    what = f"--from-run {src / POPULATION_FILE}"
    kind = found.get("kind", "population")
    if kind != "population":
        raise CorpError(
            f"--from-run '{src}' holds rows of kind '{kind}', not a population of perturbations of the base (ES rows "
            "are noise around a moving centre); take a population from `corp score`, `randopt` or `consolidate`"
        )
    return found, what


def _legacy_rows(rows: list[dict], found: dict, expected: dict, src: Path, what: str) -> tuple[list[dict], str]:
    """The rows of a population written before rows were keyed by their examples, in file order."""
    # a population written before rows were keyed by their examples: its meta names the support ids
    # and the model, not the seed; local scoring wrote rows in population order
    compare_meta(
        found,
        {k: v for k, v in expected.items() if k not in ("backend",)},
        src,
        what,
        [
            "model",
            "weights_hash",
            "task",
            "reward",
            "split",
            "example_ids",
            "noise_scheme",
            "param_filter",
            "max_new_tokens",
        ],
    )
    rows = [r for r in unique_rows(rows).values() if _LEGACY_KEY.match(str(r.get("key"))) and r.get("seed") is not None]
    for i, r in enumerate(rows):
        r.setdefault("index", i)
    rule = "first in file order (an older population without specialist indices)"
    warnings.warn(f"{what} was written by an older corp; its rows are taken in file order")
    return rows, rule


def _of_sigmas(rows: list[dict], wanted, src: Path, rule: str) -> tuple[list[dict], str]:
    """The specialists of the noise scales --from-sigmas names, still in population order."""
    # a sub-grid of the population's noise scales (the bench's sigma search): the specialists of
    # those scales, still in population order, so --population counts only them
    have = sorted({float(r["sigma"]) for r in rows})
    unknown = [s for s in wanted if not in_scales(s, have)]
    if unknown:
        raise CorpError(
            f"--from-sigmas {unknown[0]:g} is not a noise scale of --from-run '{src}' "
            f"(its scales: {', '.join(f'{h:g}' for h in have)}); pick from those"
        )
    rows = [r for r in rows if in_scales(r["sigma"], wanted)]
    rule = f"{rule}, sigma in {', '.join(f'{s:g}' for s in wanted)} (--from-sigmas)"
    return rows, rule


def ensure_population(
    ctx: RunContext, keep: int = 0, need: Callable[[list[dict]], Iterable[int]] | None = None
) -> list[dict]:
    """The scored population on the support split: the first --population specialists of
    `--from-run`, else scored (or resumed) in this run directory. Rows come back ranked by
    reward, best first (ties: population order). `ctx.population_source` says where they came from.

    With `--race halving` (corp.evaluate.racing) specialists that fall behind are stopped early and
    come back as `raced` rows (their mean over the examples they saw); `keep`: how many the race
    must score in full at least; `need(rows)`: the positions, in the ranked rows, of the
    specialists the caller will use; any of them the race stopped is scored on the rest of the
    support split first, so every row the caller uses is a full-support row."""

    cfg = ctx.cfg
    race = getattr(cfg, "race", "off")
    if cfg.from_run:
        rows, how = load_population(cfg.from_run, ctx, cfg.population)
    else:
        get_executor(
            ctx
        )  # first: with --executor ray it installs the driver's proxy, so the meta's model identity loads no model here
        sigmas, calibration = noise_scales(ctx)
        specs = specialists_for(cfg, sigmas)
        cache = EvalCache(ctx.run_dir / POPULATION_FILE)
        how = {
            "from": str(ctx.run_dir),
            "available": len(specs),
            "used": len(specs),
            "rule": "scored in this run",
            "seed": cfg.seed,
            "sigmas": sigmas,
            **({"calibration": calibration} if calibration else {}),
        }
        if race == "halving":
            rows, how["race"] = racing.race_population(
                ctx,
                specs,
                cache,
                max(keep, getattr(cfg, "race_keep", 0), 1),
                cfg.race_first,
                cfg.race_eta,
                score_specialists,
                getattr(cfg, "race_ties", "keep"),
            )
        else:
            scored = score_specialists(ctx, specs, "support", cache, desc="population", indices=range(len(specs)))
            rows = [scored[spec] for spec in specs]
        for i, r in enumerate(rows):
            r.setdefault("index", i)  # a row scored before a crash between scoring and indexing
        if getattr(cfg, "score_base", False):
            how["base_support"] = base_on_support(ctx, rows)
        stats = getattr(ctx.executor, "stats", dict)()
        if stats:  # --executor ray: workers, actor restarts and retried shards (faults Ray recovered from)
            how["executor"] = stats
    ctx.population_source = how
    warn_if_no_signal(cfg.reward, rows)
    ranked = sorted(rows, key=lambda r: (-r["reward"], r["index"]))
    if need is not None and racing.is_raced(ranked):
        before = sum(r.get("kind") == racing.RACED for r in ranked)
        ranked = racing.complete_needed(ctx, ranked, need, EvalCache(ctx.run_dir / POPULATION_FILE), score_specialists)
        ranked.sort(key=lambda r: (-r["reward"], r["index"]))
        how["completed_after_race"] = before - sum(r.get("kind") == racing.RACED for r in ranked)
    return ranked


def base_on_support(ctx: RunContext, rows: Sequence[dict]) -> dict:
    """The base on the support split (one pass, cached in evals.jsonl under the specialists' support ids)
    and how many fully scored specialists beat it there: by any reward, and by 1, 2, 4 and 8 correct
    examples (the margins a density is usually read at). Analysis only: no method selects with it, so
    its tokens are reported here and charged to none."""
    base = score_specialists(ctx, [(None, None)], "support", run_evals(ctx), desc="base on support")[(None, None)]
    full = [r for r in rows if r.get("kind", "specialist") != RACED]
    right = sum(base["correct"])
    return {
        "reward": base["reward"],
        "correct": right,
        "n_examples": len(base["correct"]),
        "specialists": len(full),
        "above": sum(r["reward"] > base["reward"] for r in full),
        "above_by": {str(m): sum(sum(r["correct"]) >= right + m for r in full) for m in (1, 2, 4, 8)},
        "prompt_tokens": base["prompt_tokens"],
        "generated_tokens": base["generated_tokens"],
    }


def base_line(source: dict | None) -> str:
    """The report's line on the base's support score (`--score-base`), empty without one."""
    b = (source or {}).get("base_support")
    if not b:
        return ""
    return (
        f"base on support: {b['correct']} of {b['n_examples']} correct (reward {b['reward']:.3f}); "
        f"{b['above']} of {b['specialists']} specialists score above it, "
        f"{b['above_by']['4']} by 4 or more examples (that pass is charged to no method)"
    )


def rows_ledger(ctx: RunContext, rows: Sequence[dict]) -> Ledger:
    """Tokens and FLOPs of the generations behind some result rows."""
    return ctx.ledger().add_rows(rows)


def selection_ledger(ctx: RunContext, rows: Sequence[dict]) -> Ledger:
    """What selecting from these population rows cost: their generations, plus the noise-scale calibration
    that chose the population's scales (`ctx.population_source`), charged to every method that reads it."""
    led = rows_ledger(ctx, rows)
    cal = (ctx.population_source or {}).get("calibration")
    if cal:
        charge(led, cal)
    return led


def _blind_to_completions(rows: list[dict]) -> bool:
    """Whether every specialist got the same reward on each example although their completions differ: a
    reward that reads the prompt or the other columns but not what the model wrote (rows compared within
    their example set: a race's first rung scores fewer examples)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("rewards") and r.get("completion_hashes"):
            groups.setdefault(r.get("ids_hash", ""), []).append(r)
    groups = {k: g for k, g in groups.items() if len(g) > 1}
    same = all(r["rewards"] == g[0]["rewards"] for g in groups.values() for r in g)
    differ = any(r["completion_hashes"] != g[0]["completion_hashes"] for g in groups.values() for r in g)
    return bool(groups) and same and differ


def warn_if_no_signal(reward: str | None, rows: list[dict]) -> None:
    """One warning line when a user's reward does not vary across the population: it returned one value for
    every completion of every specialist (TRL's `reward_len` on conversational prompts counts the messages of
    each completion, always one), or each example's one value for every specialist although their completions
    differ (it ignores the completions). Every selection made by it is then a tie. The task's own check is left
    out: all 0 there says the model cannot do the task, not that the check is wrong."""
    values = {v for r in rows for v in r.get("rewards") or () if v is not None}
    if reward in (None, "", "correct") or len(rows) < 2:
        return
    name = reward[len(IN_PROCESS) :].rpartition("@")[0] if reward.startswith(IN_PROCESS) else reward
    if len(values) == 1:
        what = f"returned {values.pop()!r} for every completion of all {len(rows)} specialists on the support split"
    elif _blind_to_completions(rows):
        what = (
            f"gave all {len(rows)} specialists the same reward on each support example although their "
            "completions differ"
        )
    else:
        return
    warnings.warn(
        f"the reward '{name}' {what}: it carries no signal to select by; check what it computes on corp's "
        "completions (on conversational prompts each is a list of messages, as in TRL: completion[0]['content'] "
        "is the text)",
        stacklevel=2,
    )
