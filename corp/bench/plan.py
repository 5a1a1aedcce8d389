"""The bench's plan, pure (nothing runs): every cell (`Cell`: task, setting, seed, method variant,
budget, options; its run key and record name), the split sizes a method sees in a data setting,
the rows a cell can report, and the hyperparameter trials of a final cell."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from corp.bench.config import BENCH_PROTOCOL, BenchConfig, common_options, file_slug
from corp.bench.search import trial_options
from corp.config import PopulationConfig
from corp.errors import CorpError
from corp.method import FIXED, ITERATIVE, POPULATION, BenchAdapter
from corp.methods import REGISTRY, get_method

RECORD_FORMAT = 2


# options that locate or speed up a cell without changing what it computes
NOT_IDENTITY = ("run_dir", "threads", "report_to", "from_run", "eval_cache")


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
    # made without graph compilation says so in its own key (corp.runtime.context.shared_salt)
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "max_model_len",  # the engine's context: a prompt that does not fit is refused, never cut
    "score_base",  # the base's own support row, beside the population's rows (the bench always asks for it)
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
    share: float = 1.0  # of the budget the cell may spend (a method's `budget_share`: its tuning charged to it)

    @property
    def spend(self) -> float | None:
        """What the cell may spend: its budget (the label its rows are compared at) times its method's share."""
        return None if self.budget is None else self.budget * self.share

    @property
    def adapter(self) -> BenchAdapter:
        return get_method(self.method).bench

    def run_key(self) -> str:
        """Identity of the cell's run directory: its options (for iterative cells without the unit,
        so every budget continues one training run)."""
        skip = set(NOT_IDENTITY) | ({self.adapter.unit} if self.adapter.kind == ITERATIVE else set())
        # a share other than 1 is part of it: a run grown under another share is not this cell's
        share = {} if self.share == 1.0 else {"budget_share": self.share}
        return short_hash(
            {
                "method": self.method,
                "bench_protocol": BENCH_PROTOCOL,
                **{k: v for k, v in self.opts.items() if k not in skip},
                **share,
            }
        )

    def record_name(self) -> str:
        budget = "fixed" if self.budget is None else f"{self.budget:.3e}"
        trial = "" if self.trial is None else f"__t{self.trial}"
        share = "" if self.share == 1.0 else f"__share{self.share:.6g}"
        return (
            f"{file_slug(self.task_label or self.task)}__{self.setting}__s{self.seed}__{file_slug(self.label)}{trial}"
            f"__{budget}{share}__{self.run_key()[:10]}.json"
        )


def short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
    runnable = {
        n: (s or {})
        for n, s in cfg.methods.items()
        if n in REGISTRY and get_method(n).bench is not None and not (s or {}).get("skip")
    }  # others: `missing`
    missing = _missing(cfg)
    cells: list[Cell] = []
    for task in cfg.tasks:
        if cfg.hyperparameters == "search":
            cells += _trial_cells(cfg, task, runnable)
        cells += _final_cells(cfg, task, runnable)
    return cells, missing


def _missing(cfg: BenchConfig) -> list[dict]:
    """The methods the bench lists as not run: skipped by the config (with its reason) or without a
    bench adapter; an unknown name is one error line."""
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
    return missing


def _options(cfg: BenchConfig, task: str, setting: str, seed: int, name: str, spec: dict, over: dict | None) -> dict:
    """A cell's options: the bench's common ones, the setting's split sizes, the adapter's defaults,
    the method's options and the variant's."""
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


def _budgets_of(cfg: BenchConfig, name: str) -> list:
    return [None] if get_method(name).bench.kind == FIXED else cfg.budgets


def _at_budgets(
    cfg: BenchConfig, task: str, setting: str, seed: int, name: str, label, opts: dict, **extra
) -> list[Cell]:
    """One cell of a method's variant at each of its budgets (one fixed cell for a method without one)."""
    return [
        Cell(
            task,
            setting,
            seed,
            name,
            str(label),
            b,
            dict(opts),
            task_label=cfg.label(task),
            share=cfg.budget_share(name),
            **extra,
        )
        for b in _budgets_of(cfg, name)
    ]


def _trial_cells(cfg: BenchConfig, task: str, runnable: dict) -> list[Cell]:
    """A task's hyperparameter trials (setting "tune"), for every method with a search space."""
    cells: list[Cell] = []
    for name, spec in runnable.items():
        if not spec.get("search"):
            continue
        for label, over in (spec.get("variants") or {name: {}}).items():
            for i, values in enumerate(trial_options(name, str(label), spec["search"], cfg.trials)):
                # the trials' data setting, seeds and scored split (search.py; by default the
                # paper setting on the first seed, scored on validation, as the second edition ran)
                for seed in cfg.tuning_seeds:
                    opts = {
                        **_options(cfg, task, cfg.tune_setting, seed, name, spec, over),
                        **cfg.tune_options,
                        **values,
                        "report_on": cfg.tune_split,
                    }
                    cells += _at_budgets(cfg, task, "tune", seed, name, label, opts, trial=i)
    return cells


def _final_cells(cfg: BenchConfig, task: str, runnable: dict) -> list[Cell]:
    """A task's cells in every setting, seed, method variant and budget."""
    cells: list[Cell] = []
    for setting in cfg.settings:
        for seed in cfg.seeds_of(task):
            for name, spec in runnable.items():
                if seed not in cfg.seeds_for(task, name):
                    continue  # the method runs some of the seeds only (its `seeds`)
                searched = tuple(sorted(spec.get("search") or {})) if cfg.hyperparameters == "search" else ()
                for label, over in (spec.get("variants") or {name: {}}).items():
                    opts = _options(cfg, task, setting, seed, name, spec, over)
                    cells += _at_budgets(cfg, task, setting, seed, name, label, opts, searched=searched)
    return cells


def possible_rows(cell: Cell, population_rows: bool = False) -> list[str]:
    """The row names a cell can report (as `Bench._record` names them), from its options; with
    `population_rows`, also a CoRP cell's RandOpt rows on its own population (LABEL/randopt-top1, ...)."""
    adapter = cell.adapter
    names = adapter.row_names(cell.opts) if adapter.row_names else [cell.label]
    extra = []
    if population_rows and adapter.population_rows is not None:
        ks = [int(k) for k in list_values(cell.opts.get("top_k")) if int(k) != 1]
        extra = [f"{cell.label}/randopt-top1"] + [f"{cell.label}/randopt-vote@{k}" for k in ks]
    listed = is_listed(cell.opts, adapter)
    if len(names) == 1 and not listed:
        return [cell.label, *extra]
    return (names if cell.label == cell.method else [f"{cell.label}:{n}" for n in names]) + extra


def is_listed(opts: dict, adapter: BenchAdapter) -> bool:
    """Whether a cell's rows come from a list option with several values (RandOpt's top_k: its rows
    keep their own names). Only a method whose rows are named by its options (row_names) has such
    rows: CoRP's top_k only adds RandOpt rows on its population, and its own row keeps the cell's label."""
    return adapter.row_names is not None and any(len(list_values(opts.get(k))) > 1 for k in adapter.clip)


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


def list_values(value) -> list:
    """A list option's values, given as a list or as a comma-separated string (None: none)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v.strip()]


def min_units(cell: Cell) -> int:
    """The fewest units that make a run of this cell: the adapter's minimum, or the smallest value of a
    list option that must fit the units (top_k [5] needs 5 specialists; a budget that buys fewer is
    'does not fit', never a top-1 row under the cell's name)."""
    values = [int(v) for key in cell.adapter.clip for v in list_values(cell.opts.get(key))]
    return max([cell.adapter.min_units, *([min(values)] if values else [])])


def clip_to_units(opts: dict, adapter: BenchAdapter) -> None:
    units = int(opts[adapter.unit])
    for key in adapter.clip:
        if key in opts and opts[key] is not None:
            opts[key] = [int(v) for v in list_values(opts[key]) if int(v) <= units] or [1]


def with_every_trial(cells: list[Cell]) -> list[Cell]:
    """The cells to check before compute: a cell whose options a search chooses is checked with
    every trial's values (whichever wins must be valid in every setting and at every budget)."""
    out = []
    for c in cells:
        if not c.searched:
            out.append(c)
            continue
        out += [
            dataclasses.replace(c, opts={**c.opts, **{k: t.opts[k] for k in c.searched}}, searched=())
            for t in trials_of(c, cells)
        ]
    return out


def trials_of(cell: Cell, cells: list[Cell]) -> list[Cell]:
    """The hyperparameter trials (setting "tune") of a final cell's method variant and budget, in trial
    order (a trial on several seeds: one cell per seed, in seed order)."""
    key = (cell.task, cell.method, cell.label, cell.budget)
    return sorted(
        (c for c in cells if c.setting == "tune" and (c.task, c.method, c.label, c.budget) == key),
        key=lambda c: c.trial,
    )


def merge_seeds(records: list[dict]) -> dict:
    """One trial's records over its seeds as one record for `choose`: the rows of every seed that
    produced any (a seed whose cell did not fit has none; trial_score is then the mean over the rest)."""
    return {"rows": [r for rec in records for r in rec.get("rows", [])]}
