"""`corp bench`: the matched-compute sweep over the method registry.

Every (task, data setting, seed, method variant, budget) is a cell. The sweep reads each method's
`BenchAdapter` (corp.method; its `Method.bench`, in the method's own module) and never asks which method it
runs: fixed cells run once per seed, population cells read the largest prefix of the seed's shared
scored population that fits the budget with the method's own evaluations (one `corp score` run per
seed, split sizes and noise scheme, mixing the bench's sigmas, serves every trial and every method
on those splits; a final cell whose `from_sigmas` is set reads one of exactly those scales),
iterative cells resume one training run per seed and grow it to its last checkpoint within each
budget; no cell spends more than its budget. Each cell runs the registered method on its own run
directory (WORK_DIR/NAME/...), so an interrupted cell resumes through the run layer's cache, and a
finished cell leaves a record (RESULTS_DIR/NAME/cells/*.json: its rows, per-example test outcomes,
FLOPs used, chosen options), so it is never rerun.

Everything that can be checked without generating is checked first (unknown methods, options,
split sizes, budgets below a method's minimum, the results directory), one error line each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from corp import CorpError
from corp.bench.budget import min_budget, prefix_that_fits
from corp.bench.config import BENCH_PROTOCOL, BenchConfig, _slug, _units_in, common_options, results_path
from corp.bench.protocol import check_registration
from corp.bench.retention import score_records
from corp.bench.search import choose, trial_options, trial_score
from corp.config import PopulationConfig, check_types, in_scales, load_config
from corp.ledger import flops
from corp.method import FIXED, ITERATIVE, POPULATION, BenchAdapter, get_path
from corp.methods import REGISTRY, get_method
from corp.runs import RunBusy, read_json, read_jsonl, try_flock, write_json

RECORD_FORMAT = 2
# options that locate or speed up a cell without changing what it computes
_NOT_IDENTITY = ("run_dir", "threads", "report_to", "from_run", "eval_cache")
# The options of a cell that its seed's shared population run (`corp score`) takes: every option of
# PopulationConfig except how the population is scored (executor, racing), where it comes from or
# goes (run_dir, from_run, eval_cache), its size (set from the bench config), which of its noise
# scales a cell takes (from_sigmas: a RandOpt sigma trial reads the specialists of its scales from
# the shared population) and report_on (scoring is on support). A field added to RunConfig or PopulationConfig is passed on unless listed here.
_NOT_POPULATION = {
    "population",
    "from_run",
    "from_sigmas",
    "run_dir",
    "eval_cache",
    "report_on",
    "executor",
    "workers",
    "ray_address",
    "race",
    "race_first",
    "race_eta",
    "race_ties",
    "race_keep",
    "report_to",
    # where vLLM runs (GPUs per engine, its share of each): placement, not what the rows are; a row
    # made without graph compilation says so in its own key (corp.evaluate.context.shared_salt)
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
}
POPULATION_OPTIONS = frozenset(f.name for f in dataclasses.fields(PopulationConfig)) - _NOT_POPULATION


@dataclass
class Cell:
    task: str
    setting: str
    seed: int
    method: str  # registry name
    label: str  # variant label (the row name when the method reports one row)
    budget: float | None  # None: a fixed cell (serves every budget)
    opts: dict = field(default_factory=dict)
    trial: int | None = None  # a hyperparameter trial (setting "tune"): its index among the method's trials
    searched: tuple[str, ...] = ()  # options a search chooses (a final cell is resolved from its trials before it runs)
    tuning: dict | None = None  # how the options were chosen (recorded with the cell)
    task_label: str = ""  # the task's short label (config `label:`), for file names; not part of the identity

    @property
    def adapter(self) -> BenchAdapter:
        return get_method(self.method).bench

    def run_key(self) -> str:
        """Identity of the cell's run directory: its options (for iterative cells without the unit,
        so every budget continues one training run)."""
        skip = set(_NOT_IDENTITY) | ({self.adapter.unit} if self.adapter.kind == ITERATIVE else set())
        return _hash(
            {
                "method": self.method,
                "bench_protocol": BENCH_PROTOCOL,
                **{k: v for k, v in self.opts.items() if k not in skip},
            }
        )

    def record_name(self) -> str:
        budget = "fixed" if self.budget is None else f"{self.budget:.3e}"
        trial = "" if self.trial is None else f"__t{self.trial}"
        return (
            f"{_slug(self.task_label or self.task)}__{self.setting}__s{self.seed}__{_slug(self.label)}{trial}"
            f"__{budget}__{self.run_key()[:10]}.json"
        )


GROWTH_AIM = 0.9  # share of the remaining budget an iterative cell's next growth aims at


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _progress_disabled() -> bool:
    return os.environ.get("CORP_NO_PROGRESS") == "1"


# ----------------------------------------------------------------------------- planning


def split_sizes(cfg: BenchConfig, setting: str, adapter: BenchAdapter) -> dict:
    """The split sizes a method sees in a data setting (equal-data: support = support + probe + validation)."""
    if setting == "equal-data" and adapter.equal_data:
        return {
            "n_support": cfg.n_support + cfg.n_probe + cfg.n_validation,
            "n_probe": 0,
            "n_validation": 0,
            "n_test": cfg.n_test,
        }
    return {"n_support": cfg.n_support, "n_probe": cfg.n_probe, "n_validation": cfg.n_validation, "n_test": cfg.n_test}


def plan(cfg: BenchConfig) -> tuple[list[Cell], list[dict]]:
    """Every cell of the sweep in run order, and the methods listed as missing (not built, or skipped with a reason). Under
    `hyperparameters: search` a task's trial cells (setting "tune") come before its other cells,
    whose searched options are filled in from them when they run (`Bench.resolve`)."""
    cells: list[Cell] = []
    missing: list[dict] = []
    for name, spec in cfg.methods.items():
        if (spec or {}).get("skip"):  # not run in this bench, by the config's choice: listed with its reason
            missing.append({"method": name, "reason": f"not run in this bench: {spec['skip']}"})
            continue
        method = get_method(name)  # an unknown name is one error line
        if method.bench is None:  # registered, but it has not said how to run at a budget: listed, not skipped
            missing.append(
                {
                    "method": name,
                    "reason": (
                        "registered, but its Method names no bench adapter "
                        "(METHOD.bench), so the bench cannot run it at a budget"
                    ),
                }
            )
    runnable = {
        n: (s or {})
        for n, s in cfg.methods.items()
        if n in REGISTRY and get_method(n).bench is not None and not (s or {}).get("skip")
    }  # others: `missing`

    def options(task: str, setting: str, seed: int, name: str, spec: dict, over: dict | None) -> dict:
        adapter = get_method(name).bench
        opts = {
            **common_options(cfg, task, seed),
            **split_sizes(cfg, setting, adapter),
            **adapter.defaults,
            **(spec.get("options") or {}),
            **(over or {}),
        }
        if adapter.kind == POPULATION:
            opts["sigmas"] = cfg.sigmas
        return opts

    def budgets_of(name: str) -> list:
        return [None] if get_method(name).bench.kind == FIXED else cfg.budgets

    for task in cfg.tasks:
        if cfg.hyperparameters == "search":
            for name, spec in runnable.items():
                if not spec.get("search"):
                    continue
                for label, over in (spec.get("variants") or {name: {}}).items():
                    for i, values in enumerate(trial_options(name, str(label), spec["search"], cfg.trials)):
                        # the trials' data setting, seeds and scored split (search.py; by default the
                        # paper setting on the first seed, scored on validation, as the second edition ran)
                        for seed in cfg.seeds[: cfg.tune_seeds]:
                            opts = {
                                **options(task, cfg.tune_setting, seed, name, spec, over),
                                **cfg.tune_options,
                                **values,
                                "report_on": cfg.tune_split,
                            }
                            cells.extend(
                                Cell(
                                    task,
                                    "tune",
                                    seed,
                                    name,
                                    str(label),
                                    b,
                                    dict(opts),
                                    trial=i,
                                    task_label=cfg.label(task),
                                )
                                for b in budgets_of(name)
                            )
        for setting in cfg.settings:
            for seed in cfg.seeds_of(task):
                for name, spec in runnable.items():
                    searched = tuple(sorted(spec.get("search") or {})) if cfg.hyperparameters == "search" else ()
                    for label, over in (spec.get("variants") or {name: {}}).items():
                        opts = options(task, setting, seed, name, spec, over)
                        cells.extend(
                            Cell(
                                task,
                                setting,
                                seed,
                                name,
                                str(label),
                                b,
                                dict(opts),
                                searched=searched,
                                task_label=cfg.label(task),
                            )
                            for b in budgets_of(name)
                        )
    return cells, missing


# ----------------------------------------------------------------------------- checks before compute


def check_results_dir(cfg: BenchConfig) -> Path:
    out = results_path(cfg)
    if out.exists() and not out.is_dir():
        raise CorpError(f"results directory '{out}' is a file; set results_dir/name to a directory")
    try:
        (out / "cells").mkdir(parents=True, exist_ok=True)
        probe = out / ".corp-bench-write-test"
        probe.write_text("ok")
        probe.unlink()
        for rec in sorted((out / "cells").glob("*.json")):
            _check_record(rec)
    except OSError as exc:
        raise CorpError(
            f"results directory '{out}' cannot be read or written ({type(exc).__name__}: "
            f"{exc}); fix its permissions or choose another results_dir"
        ) from None
    return out


def _check_record(rec: Path) -> None:
    """A cell record that does not parse (cut short by a full disk or a kill mid-copy) is damaged,
    not a permissions problem: one line naming it and what to do."""
    try:
        json.loads(rec.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpError(
            f"bench record '{rec}' is damaged ({exc}); move it aside (e.g. to '{rec.name}.damaged') and rerun: "
            "its cell runs again"
        ) from None


def possible_rows(cell: Cell, population_rows: bool = False) -> list[str]:
    """The row names a cell can report (as `Bench._record` names them), from its options; with
    `population_rows`, also a CoRP cell's RandOpt rows on its own population (LABEL/randopt-top1, ...)."""
    adapter = cell.adapter
    names = adapter.row_names(cell.opts) if adapter.row_names else [cell.label]
    extra = []
    if population_rows and adapter.population_rows is not None:
        ks = [int(k) for k in _values(cell.opts.get("top_k")) if int(k) != 1]
        extra = [f"{cell.label}/randopt-top1"] + [f"{cell.label}/randopt-vote@{k}" for k in ks]
    listed = _listed(cell.opts, adapter)
    if len(names) == 1 and not listed:
        return [cell.label, *extra]
    return (names if cell.label == cell.method else [f"{cell.label}:{n}" for n in names]) + extra


def _listed(opts: dict, adapter: BenchAdapter) -> bool:
    """Whether a cell's rows come from a list option with several values (RandOpt's top_k: its rows
    keep their own names). Only a method whose rows are named by its options (row_names) has such
    rows: CoRP's top_k only adds RandOpt rows on its population, and its own row keeps the cell's label."""
    return adapter.row_names is not None and any(len(_values(opts.get(k))) > 1 for k in adapter.clip)


def check_compare(cfg: BenchConfig, cells: list[Cell]) -> None:
    """One error line for a comparison naming a row no planned cell can report (a typo, a variant
    label, a K not in the options), before compute: `compare`, `primary` and `ratio_compare` alike."""
    rows = sorted({n for c in cells if c.setting != "tune" for n in possible_rows(c, cfg.population_rows)})
    pairs = [("compare", p) for p in cfg.compare]
    pairs += [("primary", [p["a"], p["b"]]) for p in getattr(cfg, "primary_list", [])]
    pairs += [("ratio_compare", [e["a"], e["b"]]) for e in cfg.ratio_compare]
    pairs += [("equivalence", [e["a"], e["b"]]) for e in getattr(cfg, "equivalence_list", [])]
    for field_name, pair in pairs:
        for name in pair:
            if name not in rows:
                hint = (
                    ""
                    if "/" not in name or cfg.population_rows
                    else " (set population_rows: true for LABEL/randopt-* rows)"
                )
                raise CorpError(
                    f"bench config: {field_name} names '{name}', a row no method "
                    f"in this bench can report; rows: {', '.join(rows)}{hint}"
                )


def _validate_options(
    cell: Cell, splits: dict | None = None, population: int | None = None, sigmas: list | None = None
) -> None:
    """Build the cell's config without running it: unknown or bad options, what the adapter's
    `check` finds wrong against the cell's splits, a list option no prefix of the bench's
    `population` can ever fit (RandOpt's top_k), and a `from_sigmas` that names a scale the bench's
    `sigmas` grid does not have, fail here, before compute."""
    method, adapter = get_method(cell.method), cell.adapter
    opts = {k: v for k, v in cell.opts.items() if k not in ("from_run", "from_sigmas")}
    try:
        opts = check_types(method.config, opts)  # before the clipping below reads them as numbers
        chosen = cell.opts.get("from_sigmas")
        if chosen is not None:
            if adapter.kind != POPULATION or opts.get("race", "off") != "off":
                raise CorpError(
                    "from_sigmas takes specialists of the shared population; only a population "
                    "method without racing reads one"
                )
            grid = [float(x) for x in (sigmas or [])]
            values = [float(x) for x in _values(chosen)]
            odd = [x for x in values if not in_scales(x, grid)]
            if not values or odd:
                raise CorpError(
                    f"from_sigmas {odd[0] if odd else '[]'} is not a scale of the bench's sigmas "
                    f"({', '.join(f'{g:g}' for g in grid)}); pick a non-empty subset of those"
                )
        if adapter.kind == POPULATION and population is not None and opts.get("race", "off") == "off":
            # a cell's population is a prefix of the shared one (a raced cell races its own, as large as fits)
            for key in adapter.clip:
                too_big = [int(v) for v in _values(opts.get(key)) if int(v) > population]
                if too_big:
                    raise CorpError(
                        f"{key} {max(too_big)} can never fit the bench's population of {population} "
                        f"specialists; lower {key} or raise population"
                    )
        if adapter.unit:
            opts[adapter.unit] = max(_min_units(cell), int(opts.get(adapter.unit) or _min_units(cell)))
            _clip(opts, adapter)
        built = load_config(method.config, None, opts)
        if adapter.check is not None and splits is not None:
            adapter.check(built, splits)
    except CorpError as exc:
        raise CorpError(f"bench config: method '{cell.method}' (variant '{cell.label}'): {exc}") from None


def _values(value) -> list:
    """A list option's values, given as a list or as a comma-separated string (None: none)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v.strip()]


def _min_units(cell: Cell) -> int:
    """The fewest units that make a run of this cell: the adapter's minimum, or the smallest value of a
    list option that must fit the units (top_k [5] needs 5 specialists; a budget that buys fewer is
    'does not fit', never a top-1 row under the cell's name)."""
    values = [int(v) for key in cell.adapter.clip for v in _values(cell.opts.get(key))]
    return max([cell.adapter.min_units, *([min(values)] if values else [])])


def _clip(opts: dict, adapter: BenchAdapter) -> None:
    units = int(opts[adapter.unit])
    for key in adapter.clip:
        if key in opts and opts[key] is not None:
            opts[key] = [int(v) for v in _values(opts[key]) if int(v) <= units] or [1]


def preflight(cfg: BenchConfig, cells: list[Cell], load_model: bool = True) -> dict:
    """Every check that needs no generation. Returns {(task, setting-of-sizes): min FLOPs info}."""
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits

    check_results_dir(cfg)
    splits_of: dict[tuple, dict] = {}
    for cell in cells:
        sizes = (
            cell.task,
            cell.opts["n_support"],
            cell.opts["n_probe"],
            cell.opts["n_validation"],
            cell.opts["n_test"],
        )
        if sizes not in splits_of:
            task = get_task(cell.task, cfg.data)
            splits_of[sizes] = make_splits(
                task, SplitSizes(*sizes[1:]), cfg.split_seed
            )  # a test size beyond the pool fails here
        _validate_options(cell, splits_of[sizes], cfg.population, cfg.sigmas)
    check_compare(cfg, cells)
    budgeted = [c for c in cells if c.adapter.kind != FIXED]
    if not (load_model and budgeted):
        return {}
    from corp.evaluate.backends import make_backend

    backend = make_backend(cfg.backend, cfg.model, cfg.device, cfg.dtype, cfg.batch_size)
    tok = backend.tokenizer  # hf and vllm both tokenise on the host (the backend contract)
    n_params = int(backend.n_params)
    prompt_tokens: dict[tuple, int] = {}
    below: dict[float, list[str]] = {}
    for cell in budgeted:
        sizes = (
            cell.task,
            cell.opts["n_support"],
            cell.opts["n_probe"],
            cell.opts["n_validation"],
            cell.opts["n_test"],
        )
        if sizes not in prompt_tokens:
            support = splits_of[sizes]["support"]
            prompt_tokens[sizes] = sum(len(tok(e.prompt)["input_ids"]) for e in support)
        adapter = cell.adapter
        need = min_budget(
            adapter.unit_evals(cell.opts), _min_units(cell), n_params, prompt_tokens[sizes], cell.opts["n_support"]
        )
        if cell.budget < need:
            below.setdefault(cell.budget, []).append(f"{cell.label} needs at least {need:.3g}")
    # a budget some methods cannot fit runs (those cells say 'does not fit'); one no method can fit is bad input
    labels = {c.label for c in budgeted}
    for budget in cfg.budgets:
        short = below.get(budget, [])
        if {x.split(" needs")[0] for x in short} >= labels:
            raise CorpError(
                f"bench config: budget {budget:.3g} FLOPs is too small for every method "
                f"({'; '.join(sorted(set(short)))}); raise or remove it"
            )
    del backend
    return {"n_params": n_params}


# ----------------------------------------------------------------------------- running cells


def _call(method_name: str, opts: dict) -> tuple[dict, float]:
    method = get_method(method_name)
    cfg = load_config(method.config, None, opts)
    t0 = time.perf_counter()
    report = method(cfg)
    return report, time.perf_counter() - t0


def _report_done(run_dir: Path) -> dict | None:
    """The report of a run that finished (its status says complete), else None."""
    status, report = run_dir / "run_status.json", run_dir / "report.json"
    if status.exists() and report.exists() and read_json(status).get("status") == "complete":
        return read_json(report)
    return None


class Bench:
    def __init__(self, cfg: BenchConfig):
        self.cfg = cfg
        self.out = results_path(cfg)
        self.work = Path(cfg.work_dir) / cfg.name
        self.populations: dict[str, dict] = {}
        self.cells: list[Cell] = []  # the plan (run_bench sets it): own_estimate finds a cell's predecessor in it
        self.calls = 0  # method invocations this process made (tests: a resumed bench makes none)
        # options added to the shared populations' `corp score` runs: where they are scored (the Ray
        # executor under `corp bench --executor ray`), never what (these options are not in their key)
        self.score_on: dict = {}

    def record_path(self, cell: Cell) -> Path:
        return self.out / "cells" / cell.record_name()

    def load_record(self, cell: Cell) -> dict | None:
        """The cell's finished record; None when there is none, when it was made under another bench
        protocol (kept as it is, never reused; its name differs too, through `run_key`), or when it is
        a population cell whose prefix the `population` cap bound under another cap (rerun)."""
        path = self.record_path(cell)
        rec = read_json(path) if path.exists() else None
        if rec is None or rec.get("bench_protocol") != BENCH_PROTOCOL:
            return None
        if cell.adapter.kind == POPULATION and cell.opts.get("race", "off") == "off" and rec.get("status") == "done":
            # `population` caps a cell's prefix but is not in its key: a record the cap bound (the
            # budget would have bought more) was made under another cap when its prefix differs from it
            units = int(rec.get("units") or 0)
            if units > self.cfg.population or (rec.get("budget_reached") is False and units != self.cfg.population):
                return None
        return rec

    def run_cell(self, cell: Cell) -> dict:
        rec = self.load_record(cell)
        if rec is not None:
            return rec
        kind = cell.adapter.kind
        rec = {FIXED: self._fixed, POPULATION: self._population_cell, ITERATIVE: self._iterative}[kind](cell)
        write_json(self.record_path(cell), rec)
        return rec

    def _claim_path(self, cell: Cell) -> Path:
        """A cell's claim file; an iterative cell's is its run's (every budget continues one training
        run, so one process takes them all, in order)."""
        name = self._run_dir(cell).name if cell.adapter.kind == ITERATIVE else cell.record_name()
        return self.work / "claims" / f"{name}.lock"

    def busy(self, cell: Cell) -> bool:
        """Whether another process holds the cell's claim (it is computing it now)."""
        path = self._claim_path(cell)
        if not path.exists():
            return False
        with open(path, "a+") as fh:
            return not try_flock(fh)

    def attempt(self, cell: Cell) -> dict | None:
        """Run the cell unless another process holds it: its claim (an flock on a file per cell,
        released when the process ends) or a run directory it needs (RunBusy, e.g. a shared
        population being scored). None: deferred to a later pass. Several `corp bench` processes
        may so share one task: each runs the cells no other holds."""
        path = self._claim_path(cell)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as fh:
            if not try_flock(fh):
                return None
            try:
                return self.run_cell(cell)  # re-reads the record first: another process may have finished it
            except RunBusy:
                return None

    def _run_dir(self, cell: Cell, key: str | None = None) -> Path:
        return self.work / f"{_slug(cell.task)}__{_slug(cell.label)}__s{cell.seed}__{(key or cell.run_key())[:12]}"

    def _invoke(self, method: str, opts: dict) -> tuple[dict, float]:
        self.calls += 1
        return _call(method, opts)

    def _fixed(self, cell: Cell) -> dict:
        run_dir = self._run_dir(cell)
        report, wall = self._invoke(cell.method, {**cell.opts, "run_dir": str(run_dir)})
        return self._record(cell, report, run_dir, wall, units=None)

    # -- population cells: the largest prefix of the seed's shared population that fits the budget
    def population(self, cell: Cell) -> dict:
        """The seed's shared population (one `corp score` run per seed and data setting, mixing
        every scale of the bench's `sigmas`), scored as far as the cell needs. The cell's
        specialists are the population's, or, for a sigma trial (`from_sigmas`), those of its
        scales; a cell takes at most `population` of them. Scoring starts with 8 specialists and
        adds as many as the largest budget buys at their mean cost, plus one, until the cell's
        specialists cost more than the largest budget or `population` of them are scored (a
        one-scale trial of a three-scale grid may so score up to three times `population`).
        Specialist i is the same whatever the population size, so the prefix grows on resume.
        A final cell whose `from_sigmas` is set (chosen by its search, or given in its options)
        reads a population of exactly those scales instead (the trials compared scales on one shared
        population; the chosen scales' specialists are i.i.d. draws either way, and the final scores
        no specialist it cannot take).
        Returns the run directory, the population's scales and, per specialist the cell may take (in
        population order), its scoring FLOPs and seconds."""
        cfg = self.cfg
        pop_opts = {k: v for k, v in cell.opts.items() if k in POPULATION_OPTIONS}
        pop_opts["population"] = cfg.population
        chosen = cell.opts.get("from_sigmas")
        if chosen is not None and cell.setting != "tune":
            pop_opts["sigmas"] = [float(v) for v in _values(chosen)]
            chosen = None
        key = _hash({"population": {k: v for k, v in pop_opts.items() if k not in _NOT_IDENTITY}})
        run_dir = self.work / f"{_slug(cell.task)}__population__s{cell.seed}__{key[:12]}"

        def mine(sigma: float) -> bool:
            return chosen is None or in_scales(sigma, chosen)

        # the most specialists the shared run may need to score for this cell
        most = cfg.population if chosen is None else cfg.population * len(cfg.sigmas)
        top = max(cfg.budgets)
        pop = self.populations.get(key)
        while True:
            if pop is None:
                report, target, wall = _report_done(run_dir), min(cfg.population, 8), 0.0
            else:
                report, target, wall = pop["report"], pop["target"], pop["wall"]
            if report is None or report.get("population", {}).get("n", 0) < target:
                report, dt = self._invoke(
                    "score", {**pop_opts, **self.score_on, "population": target, "run_dir": str(run_dir)}
                )
                wall += dt
            rows = sorted(
                (
                    r
                    for r in read_jsonl(run_dir / "population.jsonl", key="key", unique=True)
                    if r.get("kind") == "specialist"
                ),
                key=lambda r: r["index"],
            )
            n_params = int(report["population"]["selection_ledger"]["n_params"])
            pop = {
                "run_dir": str(run_dir),
                "costs": [flops(n_params, r["prompt_tokens"], r["generated_tokens"]) for r in rows],
                "sigmas": [float(r["sigma"]) for r in rows],
                "seconds": [float(r.get("seconds", 0.0)) + float(r.get("apply_seconds", 0.0)) for r in rows],
                "wall": wall,
                "report": report,
                "target": max(target, len(rows)),
            }
            self.populations[key] = pop
            take = [i for i, sg in enumerate(pop["sigmas"]) if mine(sg)][: cfg.population]  # the cell's specialists
            own = [pop["costs"][i] for i in take]
            if len(rows) >= most or len(own) >= cfg.population or sum(own) > top or not own:
                break
            # as many more of the cell's specialists as the largest budget buys, in population terms
            more = math.ceil((top - sum(own)) / (sum(own) / len(own)) * len(rows) / len(own))
            pop["target"] = min(most, len(rows) + more + 1)
        return {
            "run_dir": pop["run_dir"],
            "scales": [float(v) for v in _values(pop_opts["sigmas"])],
            "costs": [pop["costs"][i] for i in take],
            "seconds": [pop["seconds"][i] for i in take],
            "wall": pop["wall"],
        }

    def own_estimate(self, cell: Cell) -> float | None:
        """The own-evaluation FLOPs (`own_flops`) in the record of this cell's predecessor in the
        plan: the nearest earlier cell of the same task, variant, setting and budget (the previous
        trial, or the previous seed); for the first final cell of a setting, the last trial of its
        variant and budget (trials finish before finals; a CoRP trial evaluates on the same probe
        and validation splits as its finals, so its own evaluations are the best guess there is,
        and a first try sized without one wastes a whole consolidate). None for the first trial,
        or when the predecessor has no such figure (it did not fit, or ran before the bench
        recorded it). Read from the record in every case, so a resumed bench sizes its first try
        as an uninterrupted one does."""
        before = self.predecessor(cell)
        if before is None:
            return None
        prev = self.resolve(before, self.cells)
        rec = self.load_record(prev) if prev is not None else None
        own = (rec or {}).get("own_flops") if (rec or {}).get("status") == "done" else None
        return None if own is None else float(own)

    def predecessor(self, cell: Cell) -> Cell | None:
        """The planned cell whose record `own_estimate` reads for `cell` (None: none)."""
        same = (cell.task, cell.label, cell.setting, cell.budget)
        chain = [c for c in self.cells if (c.task, c.label, c.setting, c.budget) == same]
        at = next((i for i, c in enumerate(chain) if (c.seed, c.trial) == (cell.seed, cell.trial)), 0)
        if at > 0:
            return chain[at - 1]
        trials = [c for c in self.cells if (c.task, c.label, c.setting, c.budget) == (*same[:2], "tune", same[3])]
        return None if cell.setting == "tune" or not trials else trials[-1]

    def _population_cell(self, cell: Cell) -> dict:
        """The largest prefix n whose scoring FLOPs plus the method's own evaluations on it (CoRP's
        probe, step search and gates) fit the budget. Every try is a whole run of the method, so the
        first is sized with the own evaluations its predecessor measured (`own_estimate`; the prefix
        that scoring alone affords when there is none). Then, within 4 tries and never trying a
        prefix twice: a try over the budget steps down to the prefix that fits beside the own
        evaluations it measured; a try that fits steps up to that prefix when it is larger. The
        record is the largest prefix that fitted, with every try (`tried`). A method with no own
        evaluations fits at once. Nothing over the budget is recorded."""
        adapter = cell.adapter
        pop = self.population(cell)
        costs, budget = pop["costs"], cell.budget
        full = prefix_that_fits(costs, budget)
        guess = self.own_estimate(cell)
        n = full if not guess else min(full, max(_min_units(cell), prefix_that_fits(costs, budget - guess)))
        if full < _min_units(cell):
            return self._empty(
                cell, f"budget buys {full} specialist(s); {cell.label} needs at least {_min_units(cell)}"
            )
        if cell.opts.get("race", "off") != "off":
            return self._raced_cell(cell, full)
        tried: list[dict] = []
        best: dict | None = None  # the largest prefix that fitted so far
        wall = 0.0
        # the population is part of what the run computes (a final reads its chosen scales' own)
        population = Path(pop["run_dir"]).name  # its name carries its key
        while True:
            opts = {**cell.opts, "from_run": pop["run_dir"], adapter.unit: n}
            _clip(opts, adapter)
            run_dir = self._run_dir(cell, _hash({"cell": cell.run_key(), "units": n, "population": population}))
            report, dt = self._invoke(cell.method, {**opts, "run_dir": str(run_dir)})
            wall += dt
            flops = sum(get_path(report, p) for p in adapter.flops)
            own = flops - sum(costs[:n])  # the method's own evaluations at this prefix
            # `own`: what this try's own evaluations cost, so a discarded try is counted (outputs: compute)
            tried.append({"units": n, "flops": flops, "run_dir": str(run_dir), "own": own})
            done = {t["units"] for t in tried}
            room = prefix_that_fits(costs, budget - own)  # the prefix these own evaluations leave room for
            if flops <= budget:
                if best is None or n > best["units"]:
                    best = {"units": n, "report": report, "run_dir": run_dir, "opts": opts, "own": own}
                nxt = min(full, room)
                if nxt <= n or nxt in done or len(tried) >= 4:
                    break
            else:
                nxt = min(n - 1, room)
                if best is not None and (nxt <= best["units"] or nxt in done or len(tried) >= 4):
                    break
                if best is None and (nxt < _min_units(cell) or len(tried) >= 4):
                    return self._empty(
                        cell,
                        f"{n} specialists plus {cell.label}'s own evaluations spent {flops:.3g} FLOPs, over the "
                        f"budget; with {_min_units(cell)} it would not fit either"
                        if nxt < _min_units(cell)
                        else f"4 prefixes tried ({', '.join(str(t['units']) for t in tried)}), none within the budget",
                        tried,
                    )
            n = nxt
        n = best["units"]
        rec = self._record(cell, best["report"], best["run_dir"], wall, units=n, chosen=best["opts"])
        rec["population_run"] = pop["run_dir"]
        rec["population_sigmas"] = pop["scales"]
        rec["population_seconds"] = sum(pop["seconds"][:n])
        rec["tried"] = tried
        rec["own_flops"] = best["own"]
        rec["own_estimate"] = guess  # what the first try was sized with (None: scoring alone)
        for row in rec.get(
            "rows", []
        ):  # RandOpt on CoRP's population: charged the prefix CoRP read, not its own evaluations
            if row.get("population_row"):
                row["flops"] = sum(costs[:n])
        rec["budget_reached"] = n < len(costs) or sum(costs) >= budget
        return rec

    def _raced_cell(self, cell: Cell, n: int) -> dict:
        """A population cell with racing on (`race: halving`): a raced specialist costs less, so at
        budget B the method races its own population, as large as fits: starting from the n that
        full scoring affords, the population grows by the budget's ratio to the FLOPs spent while
        the raced run fits B (at most 4 tries, up to max_units). All tries share one run directory
        per seed and variant, so chunks scored once are reused and a rerun at the chosen size
        generates nothing; the record is the largest size that fit, with every size tried."""
        adapter = cell.adapter
        run_dir = self._run_dir(cell)
        tried: list[dict] = []
        best, wall = None, 0.0
        while len(tried) < 4:
            opts = {k: v for k, v in cell.opts.items() if k != "from_run"} | {adapter.unit: n}
            _clip(opts, adapter)
            report, dt = self._invoke(cell.method, {**opts, "run_dir": str(run_dir)})
            wall += dt
            flops = sum(get_path(report, p) for p in adapter.flops)
            tried.append({"units": n, "flops": flops})
            if flops > cell.budget:
                break
            best = (n, opts)
            nxt = min(self.cfg.units_cap(cell.method), int(n * cell.budget / flops)) if flops > 0 else n + 1
            if nxt <= n:
                break
            n = nxt
        if best is None:
            return self._empty(
                cell, f"racing {tried[0]['units']} specialists spent {tried[0]['flops']:.3g} FLOPs, over the budget"
            )
        n, opts = best
        if tried[-1]["units"] != n:  # the run directory's report is the last try's: rebuild the chosen one (all cached)
            report, dt = self._invoke(cell.method, {**opts, "run_dir": str(run_dir)})
            wall += dt
        rec = self._record(cell, report, run_dir, wall, units=n, chosen=opts)
        rec["race"] = {"tried": tried, **((report.get("population") or {}).get("source") or {}).get("race", {})}
        rec["budget_reached"] = True
        return rec

    # -- iterative cells: one training run per seed, grown to its last checkpoint within the budget
    def _iterative(self, cell: Cell) -> dict:
        """Train the seed's run (shared by every budget) while its ledger stays within the budget:
        each growth adds as many units as GROWTH_AIM (90%) of the remaining budget buys at the dearest
        unit cost seen so far, until what is left buys none; the cell is the last checkpoint at or
        below the budget. A growth that crosses it (a
        unit dearer than any before) leaves the run past the budget: the record is the previous
        checkpoint's, built when it was evaluated. The unit count recorded is the report's own: a run
        directory already trained past this budget (by a larger budget's cell, or a process stopped
        before writing its record) reports its real count and FLOPs, and the cell then trains a run
        of its own from the start instead of taking that model under a smaller label."""
        adapter = cell.adapter
        earlier = [self.load_record(dataclasses.replace(cell, budget=b)) for b in self.cfg.budgets if b < cell.budget]
        earlier = [r for r in earlier if r and r.get("units")]
        units = max([r["units"] for r in earlier], default=adapter.min_units)
        spent = sum(r.get("wall_seconds_increment", 0.0) for r in earlier)
        best, seen, wall, stopped = self._grow(cell, self._run_dir(cell), units)
        if best is None and seen[0]["units"] > adapter.min_units:  # the shared run was already past this budget
            own, seen2, wall2, stopped = self._grow(
                cell, self._run_dir(cell, _hash({"cell": cell.run_key(), "budget": cell.budget})), adapter.min_units
            )
            best, seen, wall = own, seen + seen2, wall + wall2
        if best is None:
            return self._empty(
                cell, f"{seen[-1]['units']} {adapter.unit} spent {seen[-1]['flops']:.3g} FLOPs, over the budget", seen
            )
        best["wall_seconds"] = spent + wall
        best["wall_seconds_increment"] = wall
        best["grown"] = seen
        # the budget stopped the run (a growth crossed it, or what is left buys no unit at the dearest
        # cost seen), not the unit cap or a run that stopped growing
        best["budget_reached"] = stopped is None
        return best

    def _grow(self, cell: Cell, run_dir: Path, units: int) -> tuple[dict | None, list[dict], float, str | None]:
        """Grow one run from `units` while it fits: (record of the last checkpoint within the budget
        or None, every (units, FLOPs) evaluated, seconds, why it stopped if not for the budget:
        max_units or a run that did not grow)."""
        adapter = cell.adapter
        wall, best, seen, dearest = 0.0, None, [], 0.0
        stopped = None  # why the growth stopped when the budget did not stop it (budget_reached)
        while True:
            report, dt = self._invoke(cell.method, {**cell.opts, adapter.unit: units, "run_dir": str(run_dir)})
            wall += dt
            flops = sum(get_path(report, p) for p in adapter.flops)
            done = _units_in(report, adapter.units_done) if adapter.units_done else units
            seen.append({"units": done, "flops": flops})
            if flops > cell.budget:
                break
            best = self._record(cell, report, run_dir, wall, units=done, chosen={**cell.opts, adapter.unit: done})
            prev = seen[-2] if len(seen) > 1 else {"units": 0, "flops": 0.0}
            if done <= prev["units"] and len(seen) > 1:  # the run did not grow (a guard: never loop)
                stopped = "did not grow"
                break
            dearest = max(dearest, (flops - prev["flops"]) / (done - prev["units"]))
            # aim short of the budget (GROWTH_AIM of what is left): a unit can cost more than any seen
            # (longer generations), and a growth past the budget falls back to the last checkpoint,
            # which the old full-length step left far below it (bench-cpu-2's GRPO trial 1 on arith:
            # 22 steps at 1.2e13 of 2.8e13); the steps after fill the rest
            more = int(GROWTH_AIM * (cell.budget - flops) // dearest) if dearest > 0 else 1
            if done >= self.cfg.units_cap(cell.method):
                stopped = "max_units"
                break
            if more < 1:  # the remaining budget buys no unit at the dearest cost seen: the budget stops it
                break
            units = min(self.cfg.units_cap(cell.method), done + more)
        return best, seen, wall, stopped

    # -- records
    def _empty(self, cell: Cell, why: str, tried: list | None = None) -> dict:
        """A cell whose method cannot fit the budget: 'does not fit', with what was tried (never an overshoot)."""
        rec = {
            **self._head(cell),
            "status": "does not fit",
            "reason": why,
            "rows": [],
            "flops": 0.0,
            "units": 0,
            "wall_seconds": 0.0,
        }
        if tried:
            rec["tried"] = tried
        return rec

    def _head(self, cell: Cell) -> dict:
        head = {
            "format": RECORD_FORMAT,
            "bench_protocol": BENCH_PROTOCOL,
            "task": cell.task,
            "setting": cell.setting,
            "seed": cell.seed,
            "method": cell.method,
            "label": cell.label,
            "budget": cell.budget,
            "kind": cell.adapter.kind,
        }
        if cell.trial is not None:
            head["trial"] = cell.trial
        if cell.tuning is not None:
            head["tuning"] = cell.tuning
        return head

    # -- hyperparameter search: a final cell takes the options of its best trial
    def resolve(self, cell: Cell, cells: list[Cell]) -> Cell | None:
        """`cell` with its searched options set to the best trial's (corp.bench.search.choose, on
        the validation split); the cell itself when nothing is searched; None while a trial has no record."""
        if not cell.searched:
            return cell
        trials = _trials_of(cell, cells)
        records = [self.load_record(c) for c in trials]
        if not trials or any(r is None for r in records):
            return None
        # a trial run on several seeds (tune_seeds) is one candidate: its score is the mean over them
        by_trial: dict[int, list[int]] = {}
        for i, c in enumerate(trials):
            by_trial.setdefault(c.trial, []).append(i)
        merged = [_merge_seeds([records[i] for i in idx]) for idx in by_trial.values()]
        firsts = [trials[idx[0]] for idx in by_trial.values()]
        best = choose(merged)
        pick = firsts[0] if best is None else firsts[best]  # no trial fit the budget: the final cell says so too
        values = {k: pick.opts[k] for k in cell.searched}
        scores = [trial_score(rec) for rec in merged]
        cfg = self.cfg
        tuned_on = {"seed": pick.seed, "setting": "paper", "split": "validation", "examples": cfg.n_validation}
        if (cfg.tune_setting, cfg.tune_split, cfg.tune_seeds) != ("paper", "validation", 1):
            tuned_on = {
                "seeds": sorted({trials[i].seed for i in by_trial[pick.trial]}),
                "setting": cfg.tune_setting,
                "split": cfg.tune_split,
            }
        tuning = {
            "trials": len(by_trial),
            "chosen_trial": best,
            "chosen": values,
            "validation_accuracy": scores,
            "tuned_on": tuned_on,
        }
        return dataclasses.replace(cell, opts={**cell.opts, **values}, tuning=tuning)

    def _record(
        self, cell: Cell, report: dict, run_dir: Path, wall: float, units: int | None, chosen: dict | None = None
    ) -> dict:
        adapter = cell.adapter
        pattern = re.compile(adapter.rows)
        mine = [r for r in report.get("rows", []) if pattern.fullmatch(r["method"].split(" ")[0])]
        outcomes = (
            read_json(run_dir / report["test_outcomes"])
            if report.get("test_outcomes")
            else {"example_ids": None, "outcomes": {}}
        )
        # a method with one row of its own (ES, a CoRP or GRPO variant) names it by the cell's label; one
        # whose rows come from a list option (RandOpt's top_k) keeps their names even when a small
        # budget clips that list to one value, so "randopt-top1" stays "randopt-top1"
        listed = _listed(cell.opts, adapter)
        rows = []
        theirs = []  # RandOpt's rows on this CoRP cell's own population (config population_rows)
        if self.cfg.population_rows and adapter.population_rows is not None:
            other = re.compile(adapter.population_rows)
            theirs = [r for r in report.get("rows", []) if other.fullmatch(r["method"].split(" ")[0])]
        for r, on_population in [(r, False) for r in mine] + [(r, True) for r in theirs]:
            name = (
                f"{cell.label}/{r['method']}"
                if on_population
                else cell.label
                if len(mine) == 1 and not listed
                else (r["method"] if cell.label == cell.method else f"{cell.label}:{r['method']}")
            )
            rows.append(
                {
                    "name": name,
                    "report_row": r["method"],
                    "accuracy": r["accuracy"],
                    "passes_per_example": r["passes_per_example"],
                    "labelled_examples": r["labelled_examples"],
                    "test_tokens": r["ledger"]["prompt_tokens"] + r["ledger"]["generated_tokens"],
                    "test_flops": r["ledger"]["flops"],
                    "correct": outcomes["outcomes"].get(r["method"]),
                    **({"population_row": True} if on_population else {}),
                }
            )
        chosen = {
            k: v
            for k, v in (chosen or cell.opts).items()
            if k not in _NOT_IDENTITY and k not in common_options(self.cfg, cell.task, cell.seed)
        }
        extra = {}
        if "corp" in report:  # what the report says about its own decision (kept as reported)
            extra["detail"] = {"accepted": report["corp"].get("accepted"), "reason": report["corp"].get("reason")}
        return {
            **self._head(cell),
            "status": "done",
            "rows": rows,
            "example_ids": outcomes.get("example_ids"),
            "flops": sum(get_path(report, p) for p in adapter.flops),
            "units": units,
            "wall_seconds": wall,
            "hyperparameters": chosen,
            "run_dir": str(run_dir),
            **extra,
        }


def _with_every_trial(cells: list[Cell]) -> list[Cell]:
    """The cells to check before compute: a cell whose options a search chooses is checked with
    every trial's values (whichever wins must be valid in every setting and at every budget)."""
    out = []
    for c in cells:
        if not c.searched:
            out.append(c)
            continue
        out += [
            dataclasses.replace(c, opts={**c.opts, **{k: t.opts[k] for k in c.searched}}, searched=())
            for t in _trials_of(c, cells)
        ]
    return out


def _trials_of(cell: Cell, cells: list[Cell]) -> list[Cell]:
    """The hyperparameter trials (setting "tune") of a final cell's method variant and budget, in trial
    order (a trial on several seeds: one cell per seed, in seed order)."""
    key = (cell.task, cell.method, cell.label, cell.budget)
    return sorted(
        (c for c in cells if c.setting == "tune" and (c.task, c.method, c.label, c.budget) == key),
        key=lambda c: c.trial,
    )


def _merge_seeds(records: list[dict]) -> dict:
    """One trial's records over its seeds as one record for `choose`: the rows of every seed that
    produced any (a seed whose cell did not fit has none; trial_score is then the mean over the rest)."""
    return {"rows": [r for rec in records for r in rec.get("rows", [])]}


def run_bench(
    cfg: BenchConfig,
    command: str = "corp bench",
    load_model: bool = True,
    compute: bool = True,
    only_task: str | None = None,
    only_methods: list[str] | None = None,
) -> dict:
    """Plan, check, run every cell (skipping finished ones), write the outputs; returns a summary.
    `compute=False`: write the outputs from the cells finished so far, running nothing (the table
    says how many cells are still to run). `only_task`: compute only that task's cells (the
    others' finished records still go into the outputs), so one process per task can share a bench.
    `only_methods`: compute only the cells of these methods (a variant's label, e.g. `corp-r4`, or a
    registry name, which takes all its variants), so processes can split one task's methods. Any
    number of processes may also run the same cells: each claims a cell before running it
    (`Bench.attempt`), skips the ones another holds and repeats its pass until none is held.
    `executor: ray` runs the cells as Ray tasks first (corp.bench.ray_cells); the passes then find
    their records."""
    from corp.bench.report import write_outputs

    cells, missing = plan(cfg)
    by_label = {cfg.label(t): t for t in cfg.tasks}
    only_task = by_label.get(only_task, only_task)  # --task takes a task's spec or its label
    if only_task is not None and only_task not in cfg.tasks:
        raise CorpError(f"--task {only_task!r} is not a task of {cfg.name}; its tasks (labels): {', '.join(by_label)}")
    if only_methods is not None:
        known = {c.label for c in cells} | {c.method for c in cells}
        skipped = {m["method"]: m["reason"] for m in missing}
        if not only_methods:
            raise CorpError("--methods names no method; give variant labels or registry names, comma-separated")
        named = [m for m in only_methods if m in skipped]
        if named:
            raise CorpError(f"--methods {named[0]}: {cfg.name} does not run it ({skipped[named[0]]})")
        unknown = [m for m in only_methods if m not in known]
        if unknown:
            raise CorpError(
                f"--methods {','.join(unknown)}: not a method of {cfg.name}; its methods (variant labels): "
                f"{', '.join(sorted({c.label for c in cells}))}"
            )
    preflight(cfg, _with_every_trial(cells), load_model=load_model and compute)
    # the pre-registration (corp.bench.protocol): stored before the first final cell, refused once changed after
    check_registration(cfg, results_path(cfg), compute)
    bench = Bench(cfg)
    bench.cells = cells

    def mine(cell: Cell) -> bool:
        return only_task in (None, cell.task) and (
            not only_methods or bool({cell.label, cell.method} & set(only_methods))
        )

    def mine_record(rec: dict) -> bool:
        return only_task in (None, rec["task"]) and (
            not only_methods or bool({rec["label"], rec["method"]} & set(only_methods))
        )

    done_before = sum(
        1 for c in cells if (r := bench.resolve(c, cells)) is not None and bench.load_record(r) is not None
    )
    older = old_protocol_records(cfg)
    current = any(bench.load_record(r) for c in cells if (r := bench.resolve(c, cells)) is not None)
    if not compute and older and not current:
        # the first edition's outputs stay as the version that ran them wrote them
        # (this corp would write an empty report over them)
        raise CorpError(
            f"{bench.out} holds {len(older)} cell record(s) of an older bench protocol "
            f"({', '.join(sorted(set(older.values())))}; this corp runs protocol {BENCH_PROTOCOL}) "
            f"and none of protocol {BENCH_PROTOCOL}: its table.md, results.csv and plots are kept as written; "
            f"rerun the bench to compute protocol-{BENCH_PROTOCOL} cells beside them, "
            "or report with the commit that ran them"
        )
    if compute and cfg.executor == "ray":  # every cell a Ray task; the passes below then find their records
        from corp.bench.ray_cells import run_cells_on_ray

        run_cells_on_ray(bench, cells, mine)
    # Why several local processes still share a bench through claims (flocks) and passes, beside
    # --executor ray, which is the parallel path: Ray is an optional extra, and the long CPU benches run
    # as one `benchmarks/bench_run.sh` wrapper per task (a retry loop that commits each finished cell),
    # where a core freed by a finished task joins a slower one with a second wrapper on that task. The
    # claims are also what keeps a Ray bench and a local process on one results directory from running
    # a cell twice (a Ray task claims its cell the same way).
    # Passes over the plan: a cell another process holds (its claim, or a run directory it needs) or
    # a final whose trials another process is running is deferred, and the pass is repeated after
    # CORP_BENCH_WAIT seconds until none is; one process alone runs everything in its first pass.
    wait = float(os.environ.get("CORP_BENCH_WAIT", "30"))
    done: dict[str, dict] = {}
    n_pass = 0
    while True:
        n_pass += 1
        deferred = 0
        bar = tqdm(
            cells,
            desc=f"bench {cfg.name}" + (f" (pass {n_pass})" if n_pass > 1 else ""),
            unit="cell",
            initial=0,
            dynamic_ncols=True,
            disable=_progress_disabled() or not compute,
        )
        for planned in bar:
            bar.set_postfix_str(
                f"{planned.task_label or planned.task} {planned.setting} s{planned.seed} {planned.label} "
                f"{'' if planned.budget is None else f'{planned.budget:.2g}'}"
            )
            cell = bench.resolve(planned, cells)  # None: its trials have not all run
            if cell is None:
                if compute and mine(planned) and any(bench.busy(t) for t in _trials_of(planned, cells)):
                    deferred += 1
                continue
            name = cell.record_name()
            if name in done:
                continue
            rec = bench.load_record(cell)  # a finished cell needs no claim
            if rec is None and compute and mine(cell):
                rec = bench.attempt(cell)
                if rec is not None and cfg.retention and rec.get("setting") != "tune":
                    # scored now, while the cell's saved model is on disk: a long bench spans sessions
                    # whose run directories (git-ignored) are gone when a later one resumes
                    score_records(cfg, {name: rec})
            if rec is not None:
                done[name] = rec
            elif compute and mine(cell):
                deferred += 1
        bar.close()
        if not deferred:
            break
        time.sleep(wait)
    if cfg.retention and compute:  # the rest: cells another process finished, or Ray's (corp.bench.retention)
        score_records(cfg, {n: r for n, r in done.items() if mine_record(r)})
    records = list(done.values())
    tuning = [r for r in records if r["setting"] == "tune"]
    records = [r for r in records if r["setting"] != "tune"]
    n_final = sum(c.setting != "tune" for c in cells)
    summary = write_outputs(
        cfg, records, missing, command, not_run=n_final - len(records), tuning=tuning, older=len(older)
    )
    summary.update(
        cells=len(cells), reused=done_before, method_calls=bench.calls, not_run=len(cells) - len(records) - len(tuning)
    )
    return summary


def old_protocol_records(cfg: BenchConfig) -> dict[str, str]:
    """{record file name: its protocol} for the records in the bench's cells directory made under
    another bench protocol (kept, never reused or reported)."""
    cells_dir = results_path(cfg) / "cells"
    out = {}
    for path in sorted(cells_dir.glob("*.json")) if cells_dir.is_dir() else []:
        protocol = read_json(path).get("bench_protocol", 1)  # the first edition's records name none
        if protocol != BENCH_PROTOCOL:
            out[path.name] = f"protocol {protocol}"
    return out


def load_bench_config(path: str, overrides: dict | None = None) -> BenchConfig:
    return load_config(BenchConfig, path, overrides or {})
