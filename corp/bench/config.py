"""`corp bench` configuration: one dataclass, a docstring per field (YAML keys = field names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from corp import CorpError
from corp.config import PopulationConfig, RunConfig, options_from, parse_list

SETTINGS = ("paper", "equal-data")
PROTOCOLS = ("defaults", "search")


# The bench protocol: the rules that decide what a cell's row is, beyond its options. A record or
# run directory of another protocol is never reused (it stays where it is, ignored): its row was
# made under other rules. 1 (the first edition, results/bench-cpu): population methods the largest
# prefix whose scoring fits the budget with CoRP's probe/validation evaluations on top, iterative
# methods the first checkpoint at or above the budget, CoRP's pass-1 report evaluations run.
# 2 (issue 22): every cell at most its budget (population: prefix + the method's own evaluations;
# iterative: last checkpoint at or below it, else 'does not fit'), CoRP searches and gates only
# its deployed merge rule (merge_rules: [pass2]), the unit count recorded is the report's own.
# Change it whenever such a rule changes.
BENCH_PROTOCOL = 2

# options every cell of the bench gets, defined once in the methods' configs (corp.config)
RUN_OPTIONS = (
    "model",
    "n_support",
    "n_probe",
    "n_validation",
    "n_test",
    "split_seed",
    "max_new_tokens",
    "reward",
    "data",
    "backend",
    "device",
    "dtype",
    "batch_size",
    "threads",
)
POPULATION_OPTIONS = ("population", "sigmas")


@dataclass
@options_from(
    RunConfig,
    RUN_OPTIONS,
    defaults={"n_test": 500},
    docs={"n_test": "Test split size (the same examples for every method and seed)."},
)
@options_from(
    PopulationConfig,
    POPULATION_OPTIONS,
    defaults={"population": 64},
    docs={
        "population": "Size of the shared scored population per seed and data setting; population "
        "methods use its largest prefix that fits each budget."
    },
)
class BenchConfig:
    """`corp bench`'s options. The options of every cell (RUN_OPTIONS: model, splits, generation,
    backend, threads) and of the shared population (POPULATION_OPTIONS) are RunConfig's and
    PopulationConfig's fields, with a larger test split and population by default."""

    name: str = "bench"
    """Bench name: outputs go to RESULTS_DIR/NAME, run directories of its cells to WORK_DIR/NAME."""
    tasks: list[str | dict] = field(default_factory=lambda: ["arith"])
    """Tasks, comma-separated (each as `corp tasks` names them, options included); in YAML an entry may also be
    {task: SPEC, label: SHORT, seeds: [...]}, SHORT naming the task in tables and file names (default: the spec)
    and seeds the subset of `seeds` its final cells run (default: all; trials always run on the first seed)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Master seeds; every method runs once per seed (test examples are the same for every seed)."""
    budgets: list[float] = field(default_factory=lambda: [1e13, 3e13])
    """Training/selection FLOP budgets (the compute ledger's FLOPs: population scoring, ES/GRPO training, CoRP's own evaluations)."""
    settings: list[str] = field(default_factory=lambda: list(SETTINGS))
    """Data settings: paper (each method its published splits) and/or equal-data (RandOpt, ES, GRPO also select/train on probe + validation)."""
    hyperparameters: str = "defaults"
    """Hyperparameter protocol: defaults (each method's options as given here, the same for every seed and budget) or search
    (every method with a `search` space gets the same number of trials, `trials`, compared on the validation split; see corp.bench.search).
    Neither looks at the test split."""
    trials: int = 4
    """Under `hyperparameters: search`: trials per method variant and budget, the same for every method that has a search space."""
    methods: dict = field(default_factory=dict)
    """Per registered method (or a planned one, listed as missing): {options: {...}, variants: {label: {...}}, search: {...}};
    `skip: REASON` lists a method as not run, with the reason, instead of running it."""
    compare: list = field(default_factory=list)
    """Pairs [a, b] of result rows compared on the same test examples: per-seed paired differences with their within-seed intervals, a sign count, a t interval over the per-seed mean differences (k - 1 degrees of freedom) and McNemar; needs at least 2 seeds."""
    max_units: int = 10000
    """Most iterations/steps an iterative method may train while reaching a budget (a guard)."""
    results_dir: str = "results"
    """Where RESULTS_DIR/NAME (results.csv, table.md, plots, cell records) goes."""
    work_dir: str = "runs/bench"
    """Where the cells' run directories go (models and caches; not for committing)."""

    def validate(self) -> BenchConfig:
        from corp.models import resolve_device

        # `auto` is keyed as the device it means (cpu here): cells keep their keys, and a GPU run's differ
        self.device = resolve_device(self.device)
        entries = self.tasks if isinstance(self.tasks, list) else parse_list(self.tasks, str, "tasks")
        self.task_labels = {}
        own_seeds: dict[str, list[int]] = {}
        tasks = []
        for e in entries:
            if isinstance(e, dict):
                if (
                    set(e) - {"task", "label", "seeds"}
                    or not isinstance(e.get("task"), str)
                    or not str(e.get("label", e.get("task"))).strip()
                ):
                    raise CorpError(
                        f"bench config: a task entry is a task spec or {{task: SPEC, label: SHORT, seeds: [...]}}, "
                        f"got {e!r}"
                    )
                spec, label = e["task"].strip(), str(e.get("label", e["task"])).strip()
                if e.get("seeds") is not None:
                    own_seeds[spec] = parse_list(e["seeds"], int, f"seeds of task {label}")
            else:
                spec = label = str(e).strip()
            if label in self.task_labels.values():
                raise CorpError(f"bench config: task label '{label}' is used twice; give each task its own label")
            if "/" in label or label in (".", ".."):
                raise CorpError(f"bench config: task label '{label}' names files; use letters, digits, '-', '_' or '.'")
            tasks.append(spec)
            self.task_labels[spec] = label
        self.tasks = tasks
        self.seeds = parse_list(self.seeds, int, "seeds")
        for what, seeds in [("seeds", self.seeds)] + [
            (f"task {self.task_labels[t]}'s seeds", v) for t, v in own_seeds.items()
        ]:
            twice = sorted({x for x in seeds if seeds.count(x) > 1})
            if twice:  # a repeated seed is the same run twice: it would count as two seeds in every interval
                raise CorpError(f"bench config: {what} {seeds} repeat {twice[0]}; give each seed once")
        for spec, seeds in own_seeds.items():
            if not seeds or set(seeds) - set(self.seeds):
                raise CorpError(
                    f"bench config: task {self.task_labels[spec]}'s seeds {seeds} must be a non-empty subset of "
                    f"seeds {self.seeds}"
                )
        # in the bench's seed order, so every task's first seed is the one trials run on when it is included
        self.task_seeds = {t: [x for x in self.seeds if x in own_seeds.get(t, self.seeds)] for t in self.tasks}
        self.budgets = sorted(parse_list(self.budgets, float, "budgets"))
        self.settings = parse_list(self.settings, str, "settings")
        self.sigmas = parse_list(self.sigmas, float, "sigmas")
        if not self.tasks or not self.seeds or not self.budgets:
            raise CorpError("bench config: tasks, seeds and budgets must each name at least one value")
        bad = [b for b in self.budgets if not (b > 0 and math.isfinite(b))]
        if bad:
            raise CorpError(f"bench config: budgets must be > 0 FLOPs, got {bad[0]}")
        for s in self.settings:
            if s not in SETTINGS:
                raise CorpError(f"bench config: unknown setting '{s}'; choose from {', '.join(SETTINGS)}")
        if self.hyperparameters not in PROTOCOLS:
            raise CorpError(
                "bench config: unknown hyperparameter protocol "
                f"'{self.hyperparameters}'; use one of {', '.join(PROTOCOLS)}"
            )
        if not isinstance(self.methods, dict) or not self.methods:
            raise CorpError("bench config: 'methods' must map method names to {options, variants, search}")
        for name, spec in self.methods.items():
            if spec is not None and (
                not isinstance(spec, dict) or set(spec) - {"options", "variants", "search", "trials", "skip"}
            ):
                raise CorpError(
                    f"bench config: method '{name}' must be a mapping with "
                    "'options', 'variants', 'search', 'trials' and/or 'skip'"
                )
            if spec and "skip" in spec and not (isinstance(spec["skip"], str) and spec["skip"].strip()):
                raise CorpError(f"bench config: method '{name}': skip must say why the method is not run (a sentence)")
        self._option_names_to_fields()
        from corp.bench.search import check_search

        check_search(self)
        for pair in self.compare:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise CorpError(f"bench config: compare entries are pairs [a, b], got {pair!r}")
        fewest = min((len(v) for v in self.task_seeds.values()), default=len(self.seeds))
        if self.compare and fewest < 2:
            raise CorpError(
                f"bench config: {len(self.compare)} comparison(s) with {fewest} seed; an across-seed interval "
                "needs at least 2 seeds (add seeds or remove compare)"
            )
        if self.population < 1:
            raise CorpError(f"bench config: population must be >= 1, got {self.population}")
        if self.threads is not None and self.threads < 0:
            raise CorpError(
                f"bench config: threads must be >= 1 (or 0 / unset for torch's default), got {self.threads}"
            )
        if self.name in ("", ".", "..") or "/" in self.name:
            raise CorpError(f"bench config: name '{self.name}' must be a plain directory name")
        return self

    def _option_names_to_fields(self) -> None:
        """A method's options, variants and search space may use option names (`max_steps`) or field
        names (`steps`, what cell keys are built from): the former become the latter, so a cell's key
        is the same either way (docs/commands.md, "Names")."""
        from corp.config import to_fields
        from corp.methods import REGISTRY

        for name, spec in self.methods.items():
            if not spec or name not in REGISTRY:
                continue
            cls = REGISTRY.lookup(name).config_class
            for part in ("options", "search"):
                if isinstance(spec.get(part), dict):
                    spec[part] = to_fields(cls, spec[part], user=False)
            if isinstance(spec.get("variants"), dict):
                spec["variants"] = {
                    label: to_fields(cls, over, user=False) if isinstance(over, dict) else over
                    for label, over in spec["variants"].items()
                }

    def seeds_of(self, task: str) -> list[int]:
        """The seeds a task's final cells run (its entry's `seeds`, else the bench's)."""
        return getattr(self, "task_seeds", {}).get(task, self.seeds)

    def label(self, task: str) -> str:
        """The task's short label (tables, file names)."""
        return getattr(self, "task_labels", {}).get(task, task)
