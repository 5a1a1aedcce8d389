"""`corp bench` configuration: one dataclass, a docstring per field (YAML keys = field names)."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from corp.bench.config_protocol import check_protocol
from corp.bench.search import check_search
from corp.config import PopulationConfig, RunConfig, options_from, parse_list, to_fields
from corp.errors import CorpError
from corp.methods import REGISTRY
from corp.runtime.models import resolve_device
from corp.runtime.runs import bounded_name, naming

SETTINGS = ("paper", "equal-data")
PROTOCOLS = ("defaults", "search")
# the regime each method should reach at the top budget (issue 39), by method: each method's own
# (BenchAdapter.regime, in its registration). Keys: `units` (the adapter's unit at the top budget) or an
# option of the cell (n_support, population). A config's `regime_targets` replaces a method's entry.
REGIME_TARGETS = {m.name: dict(m.bench.regime) for m in REGISTRY.values() if m.bench is not None and m.bench.regime}


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
    # the paper grid, fixed: a bench's sigma trials take scales of one shared population, known when it is planned
    defaults={"population": 64, "sigmas": "5e-4,1e-3,2e-3"},
    docs={
        "population": "Size of the shared scored population per seed and data setting; population "
        "methods use its largest prefix that fits each budget.",
        "sigmas": "Noise scales of the shared populations, comma-separated (fixed: the bench plans its sigma "
        "trials on them; `corp score --sigmas auto` measures what a model's calibration would choose).",
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
    and seeds the subset of `seeds` its final cells run (default: all; trials run on `tune_seeds`)."""
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
    primary: list = field(default_factory=list)
    """Pre-registered primary comparisons (at most 6), named before any final cell runs: each
    'A vs B @ BUDGET on TASK' (BUDGET one of `budgets` or `top`; append ' in SETTING' for another than
    the headline setting) or {a, b, budget, task, setting}. The report shows them apart from the
    exploratory ones (`compare`) and corrects them for multiplicity (Holm, over all of them). When
    the first final cell is written their hash, with `test_set` and the test examples' ids, is
    stored beside the cells (preregistration.json); a later run whose primary set or test set differs
    is refused."""
    test_set: str = ""
    """The test set's name, registered with `primary` (required with it): e.g. the split edition the
    tasks' test examples come from. The registration also hashes every task's test example ids."""
    tune_setting: str = "paper"
    """Under search: the data setting whose split sizes the trials use (paper; equal-data tunes in the
    final setting, which needs a `tune_split` outside the 144 labelled examples, e.g. a development split)."""
    tune_split: str = "validation"
    """Under search: the split the trials are scored on (`report_on` of every trial; never test): validation, or dev (a
    task spec with heldout=START,dev=N has a development pool outside every split)."""
    tune_seeds: int | list[int] = 1
    """Under search: the seeds every trial runs on, a trial's score being its mean over them: seeds of their own,
    none of them in `seeds` (a list, e.g. [100, 101], or the string "100,101": no final seed is a tuning seed),
    or, as a YAML number N, the first N of `seeds` (the third edition's: its final seeds 0-1 were its tuning seeds)."""
    tune_options: dict = field(default_factory=dict)
    """Under search: options every trial cell gets on top of its method's (e.g. the size of a development split)."""
    population_rows: bool = False
    """Also report, from each CoRP cell, RandOpt top-1 and vote@K on CoRP's own population (rows
    LABEL/randopt-top1, LABEL/randopt-vote@K; K from consolidate's top_k), charged the population
    prefix CoRP read: the CoRP paper's comparison at the same population."""
    ratio_compare: list = field(default_factory=list)
    """Comparisons of a row at N units against another at RATIO x N (the CoRP paper's CoRP at N
    vs RandOpt at 10N): entries {a: ROW, b: ROW, ratio: 10}; per task, setting and budget of a, b is
    taken at the smallest budget where its mean units reach RATIO x a's (none: the report says so)."""
    protocol_tables: bool = False
    """Third-edition report sections: each method's total compute with its search and discarded
    tries beside its final cells', the regime reached at the top budget against `regime_targets`
    (with its curve over budgets when below), and the distinct labelled examples each method touched."""
    regime_targets: dict = field(default_factory=dict)
    """Per registry method, the regime it should reach at the top budget ({units: N, OPTION: N}),
    replacing corp.bench.config.REGIME_TARGETS' entry (RandOpt 50 specialists, CoRP 200 on 64 support,
    ES population 30 x 100 iterations, GRPO/F-TIS 100 steps)."""
    retention: bool = False
    """Score what each final model costs off its task (corp.bench.retention, issue 39): after the cells run,
    every final cell at the top budget in the headline setting whose row is one model (a saved model, the
    base; not a vote or sampling ensemble) gets bits per byte on held-out public-domain text and greedy
    accuracy on `retention_tasks`, beside the base, stored in RESULTS_DIR/NAME/retention/ (never redone);
    its FLOPs are reported, not charged to the method's budget (evaluation, like test)."""
    retention_tasks: list[str] = field(default_factory=list)
    """Under `retention`: the tasks that count as off-task (specs as in `tasks`); default: the bench's other tasks."""
    retention_texts: list[str] = field(default_factory=lambda: ["verne-2889"])
    """Under `retention`: the texts bits per byte is pooled over, as `corp eval --retention-texts` takes them
    (corp's names or paths; `make retention-texts` fetches bierce-devils-dictionary and jargon-file). Checked
    when the config loads; a retention record scored on other texts is refused, not mixed in."""
    equivalence: list = field(default_factory=list)
    """Equivalence tests declared before the run: entries {a: ROW, b: ROW, margin: M} (optionally task,
    budget, setting); per task, setting and budget where both rows ran on >= 2 seeds, two one-sided
    tests (corp.algorithms.stats.tost) of |a - b| < M on the across-seed interval's t, reported in their own section."""
    max_units: int = 10000
    """Most iterations/steps an iterative method may train while reaching a budget (a guard); a method's
    entry may set its own (`methods: {es: {max_units: 20}}`)."""
    results_dir: str = "results"
    """Where RESULTS_DIR/NAME (results.csv, table.md, plots, cell records) goes."""
    work_dir: str = "runs/bench"
    """Where the cells' run directories go (models and caches; not for committing)."""
    executor: str = "local"
    """Where cells run: local (this process, cell after cell) or ray (each cell a Ray task reserving its threads, or a
    GPU on CUDA, and the shared populations scored by Ray actors); the outputs are the same either way."""
    workers: int = 2
    """--executor ray on a local Ray: cells at once (each with threads cores/workers unless `threads` is set), and
    the actors that score a shared population."""
    ray_address: str | None = None
    """--executor ray: join this Ray cluster (e.g. `auto`) instead of starting a local one on loopback; WORK_DIR and
    RESULTS_DIR must then be on a filesystem every node sees."""

    def validate(self) -> BenchConfig:
        # `auto` is keyed as the device it means (cpu here): cells keep their keys, and a GPU run's differ
        self.device = resolve_device(self.device)
        own_seeds = self._parse_tasks()
        self._check_seeds(own_seeds)
        self._check_grid()
        self._check_methods()
        self._option_names_to_fields()
        check_search(self)
        self._check_compare()
        if self.population < 1:
            raise CorpError(f"bench config: population must be >= 1, got {self.population}")
        check_protocol(self, SETTINGS)
        self._check_run()
        return self

    def _parse_tasks(self) -> dict[str, list[int]]:
        """Task entries (a spec, or {task, label, seeds}) -> self.tasks and self.task_labels; returns
        the seeds a task entry names for itself."""
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
        return own_seeds

    def _check_seeds(self, own_seeds: dict[str, list[int]]) -> None:
        """seeds, each once; a task's own seeds a subset of them; self.task_seeds in the bench's order."""
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

    def _check_grid(self) -> None:
        """budgets, settings, sigmas and the hyperparameter protocol."""
        self.budgets = sorted(parse_list(self.budgets, float, "budgets"))
        self.settings = parse_list(self.settings, str, "settings")
        if isinstance(self.sigmas, str) and self.sigmas.strip().lower() == "auto":
            raise CorpError(
                "bench config: sigmas auto is not supported (the bench plans its sigma trials on the scales of "
                "one shared population); give the scales, e.g. sigmas: [5.0e-4, 1.0e-3, 2.0e-3]"
            )
        self.sigmas = parse_list(self.sigmas, float, "sigmas")
        if not self.tasks or not self.seeds or not self.budgets:
            raise CorpError("bench config: tasks, seeds and budgets must each name at least one value")
        bad = [b for b in self.budgets if not (b > 0 and math.isfinite(b))]
        if bad:
            raise CorpError(f"bench config: budgets must be > 0 FLOPs, got {bad[0]}")
        twice = [b for b, c in zip(self.budgets, self.budgets[1:]) if math.isclose(b, c, rel_tol=1e-9)]
        if twice:  # one budget twice is every cell at it twice: the same runs counted as two budgets
            raise CorpError(f"bench config: budgets repeat {twice[0]:.3g}; give each budget once")
        for s in self.settings:
            if s not in SETTINGS:
                raise CorpError(f"bench config: unknown setting '{s}'; choose from {', '.join(SETTINGS)}")
        if self.hyperparameters not in PROTOCOLS:
            raise CorpError(
                "bench config: unknown hyperparameter protocol "
                f"'{self.hyperparameters}'; use one of {', '.join(PROTOCOLS)}"
            )

    def _check_methods(self) -> None:
        """methods: a mapping of names to {options, variants, search, trials, max_units, seeds, budget_share, skip}."""
        if not isinstance(self.methods, dict) or not self.methods:
            raise CorpError("bench config: 'methods' must map method names to {options, variants, search}")
        for name, spec in self.methods.items():
            if spec is not None and (
                not isinstance(spec, dict)
                or set(spec) - {"options", "variants", "search", "trials", "skip", "max_units", "seeds", "budget_share"}
            ):
                raise CorpError(
                    f"bench config: method '{name}' must be a mapping with "
                    "'options', 'variants', 'search', 'trials', 'max_units', 'seeds', 'budget_share' and/or 'skip'"
                )
            self._check_method_limits(name, spec or {})
            if spec and "seeds" in spec:
                self._check_method_seeds(name, spec)

    def _check_method_limits(self, name: str, spec: dict) -> None:
        """A method's `budget_share`, `max_units` and `skip`."""
        if "budget_share" in spec:
            # its trials and finals spend share x the budget, so that with its tuning charged its final models
            # cost the budget: share = finals / (trials x tuning seeds + finals)
            share = spec["budget_share"]
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
                raise CorpError(
                    f"bench config: method '{name}': budget_share must be a number in (0, 1], got {share!r}"
                )
        cap = spec.get("max_units")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise CorpError(f"bench config: method '{name}': max_units is a positive whole number, got {cap!r}")
        if "skip" in spec and not (isinstance(spec["skip"], str) and spec["skip"].strip()):
            raise CorpError(f"bench config: method '{name}': skip must say why the method is not run (a sentence)")

    def _check_method_seeds(self, name: str, spec: dict) -> None:
        """A method's own `seeds`: its final cells on some of the bench's seeds only (an exploratory row that
        costs many hours a seed); its comparisons pair the seeds both sides have."""
        own = parse_list(spec["seeds"], int, f"seeds of method {name}")
        if not own or len(set(own)) < len(own) or set(own) - set(self.seeds):
            raise CorpError(
                f"bench config: method '{name}': seeds {own} must be distinct seeds of the bench's {self.seeds}"
            )
        spec["seeds"] = own
        if bare := [self.label(t) for t in self.tasks if not set(own) & set(self.seeds_of(t))]:
            raise CorpError(f"bench config: method '{name}': none of its seeds {own} is a seed of task {bare[0]}")

    def _check_compare(self) -> None:
        """compare: pairs, and seeds enough for an across-seed interval."""
        for pair in self.compare:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise CorpError(f"bench config: compare entries are pairs [a, b], got {pair!r}")
        fewest = min((len(v) for v in self.task_seeds.values()), default=len(self.seeds))
        if self.compare and fewest < 2:
            raise CorpError(
                f"bench config: {len(self.compare)} comparison(s) with {fewest} seed; an across-seed interval "
                "needs at least 2 seeds (add seeds or remove compare)"
            )

    def _check_run(self) -> None:
        """threads, executor, workers, ray_address and the bench's name."""
        if self.threads is not None and self.threads < 0:
            raise CorpError(
                f"bench config: threads must be >= 1 (or 0 / unset for torch's default), got {self.threads}"
            )
        if self.executor not in ("local", "ray"):
            raise CorpError(f"bench config: unknown executor '{self.executor}'; choose local or ray")
        if self.workers < 1:
            raise CorpError(f"bench config: workers must be >= 1, got {self.workers}")
        if self.ray_address and self.executor != "ray":
            raise CorpError("bench config: ray_address needs executor ray (--executor ray)")
        if self.name in ("", ".", "..") or "/" in self.name:
            raise CorpError(f"bench config: name '{self.name}' must be a plain directory name")

    def _option_names_to_fields(self) -> None:
        """A method's options, variants and search space may use option names (`max_steps`) or field
        names (`steps`, what cell keys are built from): the former become the latter, so a cell's key
        is the same either way (docs/commands.md, "Names")."""

        for name, spec in self.methods.items():
            if not spec or name not in REGISTRY:
                continue
            cls = REGISTRY.lookup(name).config
            for part in ("options", "search"):
                if isinstance(spec.get(part), dict):
                    spec[part] = to_fields(cls, spec[part], user=False)
            if isinstance(spec.get("variants"), dict):
                spec["variants"] = {
                    label: to_fields(cls, over, user=False) if isinstance(over, dict) else over
                    for label, over in spec["variants"].items()
                }

    def budget_share(self, method: str) -> float:
        """The share of each budget `method`'s cells spend (its `budget_share`, else 1): its rows are still
        compared at the budget."""
        return float((self.methods.get(method) or {}).get("budget_share") or 1.0)

    def row_share(self, row: str) -> float:
        """The budget share of the method a table row comes from (LABEL, LABEL:NAME or LABEL/randopt-...: a method's
        name or one of its variants' labels); 1 for a row no method names (the base)."""
        label = row.split("/")[0].split(":")[0]
        for name, spec in self.methods.items():
            if label in (name, *((spec or {}).get("variants") or {})):
                return self.budget_share(name)
        return 1.0

    def units_cap(self, method: str) -> int:
        """The most units an iterative method may train: its own `max_units` (a method whose unit
        costs far more time than its FLOPs say, e.g. ES's weight reloads), else the bench's."""
        return int((self.methods.get(method) or {}).get("max_units") or self.max_units)

    @property
    def tuning_seeds(self) -> list[int]:
        """The seeds the trials run on (`tune_seeds`: the first N of `seeds`, or a list of its own)."""
        return list(self.tune_seeds) if isinstance(self.tune_seeds, list) else self.seeds[: self.tune_seeds]

    def seeds_for(self, task: str, cell: str | None = None) -> list[int]:
        """The seeds the final cells of `cell` (a method's name or variant label) run on in `task`: the task's
        seeds, limited by the method's own `seeds` where it sets them."""
        seeds = self.seeds_of(task)
        for name, spec in self.methods.items():
            if cell in (name, *((spec or {}).get("variants") or {})) and (spec or {}).get("seeds"):
                return [s for s in seeds if s in spec["seeds"]]
        return seeds

    def seeds_of(self, task: str) -> list[int]:
        """The seeds a task's final cells run (its entry's `seeds`, else the bench's)."""
        return getattr(self, "task_seeds", {}).get(task, self.seeds)

    def label(self, task: str) -> str:
        """The task's short label (tables, file names)."""
        return getattr(self, "task_labels", {}).get(task, task)


# ---------------------------------------------------------------- helpers of the sweep, its outputs and
# retention (here, below all three, so none of them imports another's internals)


def file_slug(text: str) -> str:
    """A file-name part from user input, bounded in length (a hash of the whole keeps long ones apart)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")
    return slug if len(slug) <= 64 else f"{slug[:51]}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def common_options(cfg: BenchConfig, task: str, seed: int) -> dict:
    out = {
        "model": cfg.model,
        "task": task,
        "seed": seed,
        "split_seed": cfg.split_seed,
        "backend": cfg.backend,
        "device": cfg.device,
        "batch_size": cfg.batch_size,
        "threads": cfg.threads,
        # one shared cache of greedy base/specialist evaluations per task: the base's test
        # evaluation (the same test ids in every seed) and a specialist chosen by several cells run once
        "eval_cache": str(Path(cfg.work_dir) / cfg.name / f"{file_slug(task)}__shared_evals.jsonl"),
    }
    for key in ("max_new_tokens", "reward", "data", "dtype"):
        if getattr(cfg, key) is not None:
            out[key] = getattr(cfg, key)
    return out


def results_path(cfg: BenchConfig) -> Path:
    return Path(cfg.results_dir) / cfg.name


def units_in(report: dict, dotted: str) -> int:
    """The trained unit count a report states at `dotted`: a number, or a list of per-unit entries (FGRPO's rounds)."""
    node = report
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, list):
        return len(node)
    if node is None:
        raise CorpError(f"the report names no '{dotted}' (the units its model was trained for)")
    return int(node)


def budget_text(b) -> str:
    return "any" if b is None else f"{b:.2g}"


def at_budget(rows: list[dict], task: str, setting: str, budget) -> dict[str, list[dict]]:
    """Rows of one (task, setting) that hold at `budget`: the budget's own cells and fixed cells."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if (
            r["task"] == task
            and r["setting"] == setting
            and (r["budget"] == budget or r["budget"] is None)
            and r["accuracy"] is not None
        ):
            out.setdefault(r["method"], []).append(r)
    return out


def headline_setting(cfg: BenchConfig) -> str:
    """Equal data is the headline setting when it ran (every method then sees the same labelled examples)."""
    return "equal-data" if "equal-data" in cfg.settings else cfg.settings[0]


def file_part(text: str) -> str:
    """A file-name part from a task label, shortened as cell names are (a 300-character label
    would make a name longer than a file system takes)."""
    return bounded_name("".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text))


def save_plot(fig, out: Path, name: str) -> str:
    """Lay `fig` out, write it to out/name (PNG at the bench's 110 dpi) and close it; returns `name`.
    A full disk names the file (corp.runtime.runs.naming). The caller drew it, so matplotlib is loaded."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with naming(out / name):
        fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
