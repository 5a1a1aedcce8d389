"""`corp bench` configuration: one dataclass, a docstring per field (YAML keys = field names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from corp import CorpError
from corp.config import parse_list

SETTINGS = ("paper", "equal-data")
PROTOCOLS = ("defaults", "search")


@dataclass
class BenchConfig:
    name: str = "bench"
    """Bench name: outputs go to RESULTS_DIR/NAME, run directories of its cells to WORK_DIR/NAME."""
    model: str = "smollm2-135m"
    """Model every method starts from (alias, local directory or hub id)."""
    tasks: list[str] = field(default_factory=lambda: ["arith"])
    """Tasks, comma-separated (each as `corp tasks` names them, options included)."""
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
    population: int = 64
    """Size of the shared scored population per seed and data setting; population methods use its largest prefix that fits each budget."""
    sigmas: list[float] = field(default_factory=lambda: [5e-4, 1e-3, 2e-3])
    """Noise scales of the shared population."""
    methods: dict = field(default_factory=dict)
    """Per registered method (or a planned one, listed as missing): {options: {...}, variants: {label: {...}}}."""
    compare: list = field(default_factory=list)
    """Pairs [a, b] of result rows compared on the same test examples (paired bootstrap CI and McNemar, seeds pooled)."""
    n_support: int = 64
    """Support split size."""
    n_probe: int = 32
    """Probe split size."""
    n_validation: int = 64
    """Validation split size."""
    n_test: int = 500
    """Test split size (the same examples for every method and seed)."""
    split_seed: int = 0
    """Seed that fixes the splits."""
    max_new_tokens: int | None = None
    """Generation length limit; default: the task's."""
    reward: str | None = None
    """Reward function (default: the task's check)."""
    data: str | None = None
    """Benchmark data directory (default: $CORP_DATA_DIR)."""
    backend: str = "auto"
    """Generation backend of every cell."""
    device: str = "cpu"
    """Torch device."""
    dtype: str | None = None
    """Model dtype."""
    batch_size: int = 64
    """Prompts per generation batch."""
    threads: int | None = None
    """Torch CPU threads of every cell (unset or 0: torch's default, all usable cores)."""
    max_units: int = 10000
    """Most iterations/steps an iterative method may train while reaching a budget (a guard)."""
    results_dir: str = "results"
    """Where RESULTS_DIR/NAME (results.csv, table.md, plots, cell records) goes."""
    work_dir: str = "runs/bench"
    """Where the cells' run directories go (models and caches; not for committing)."""

    def validate(self) -> "BenchConfig":
        self.tasks = parse_list(self.tasks, str, "tasks")
        self.seeds = parse_list(self.seeds, int, "seeds")
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
            raise CorpError(f"bench config: unknown hyperparameter protocol '{self.hyperparameters}'; use one of {', '.join(PROTOCOLS)}")
        if not isinstance(self.methods, dict) or not self.methods:
            raise CorpError("bench config: 'methods' must map method names to {options, variants, search}")
        for name, spec in self.methods.items():
            if spec is not None and (not isinstance(spec, dict) or set(spec) - {"options", "variants", "search"}):
                raise CorpError(f"bench config: method '{name}' must be a mapping with 'options', 'variants' and/or 'search'")
        from corp.bench.search import check_search

        check_search(self)
        for pair in self.compare:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise CorpError(f"bench config: compare entries are pairs [a, b], got {pair!r}")
        if self.population < 1:
            raise CorpError(f"bench config: population must be >= 1, got {self.population}")
        if self.threads is not None and self.threads < 0:
            raise CorpError(f"bench config: threads must be >= 1 (or 0 / unset for torch's default), "
                            f"got {self.threads}")
        if self.name in ("", ".", "..") or "/" in self.name:
            raise CorpError(f"bench config: name '{self.name}' must be a plain directory name")
        return self
