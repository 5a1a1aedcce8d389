"""What a method is: one `Method` object, exported by its module under corp/methods/ (issue 38).

In the spirit of mergekit's merge methods and evosax's strategies: a method is a config dataclass (a
`corp.config.RunConfig` subclass, one docstring per field) plus a run function `run(cfg) -> report
dict` that writes `report.json` (schema `corp.runtime.runs.REPORT_SCHEMA`), and where the method makes one,
`recipe.json` and a model directory, into the run directory. Its `Method` carries everything else
about it: the CLI's help line, smoke options for the tests, the terminal summary, and how `corp
bench` runs it at a compute budget (`BenchAdapter`, typed code: cost rules, report rows and fields).

This module is in the core so that a method module, the registry (corp/methods/__init__.py), the
bench and the CLI all read one definition; it imports no method.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corp.config import PopulationConfig
from corp.config_types import comma_list
from corp.runtime.models import check_output_dir

# split sizes of a smoke run: every split non-empty, so any method finds what it needs
SMALL = {"n_support": 4, "n_probe": 4, "n_validation": 4, "n_test": 4, "max_new_tokens": 4, "batch_size": 8}

# ---------------------------------------------------------------- how the bench runs a method

FIXED, POPULATION, ITERATIVE = "fixed", "population", "iterative"


@dataclass(frozen=True)
class BenchAdapter:
    """How `corp bench` runs a method at a compute budget. The sweep (corp.bench.sweep) only reads
    these fields and never asks which method it is running.

    `kind` says how compute is matched:
    "fixed": the method spends no training or selection compute (the base, self-consistency); one
    cell per seed serves every budget.
    "population": the method reads a scored population (`--from-run` of the bench's shared `corp
    score` run of that seed and data setting); at budget B it gets the largest population prefix
    whose scoring FLOPs plus the method's own evaluations on it fit in B (`unit` = the option that
    sets the prefix length).
    "iterative": the method trains step by step and resumes on its run directory with a larger
    `unit` (ES iterations, GRPO steps); at budget B it is evaluated at its last checkpoint whose
    training ledger is at or below B (a method that cannot fit B is 'does not fit').
    """

    kind: str
    """fixed | population | iterative (see above)."""
    rows: str
    """Regex of the report rows that are this method's (matched against the whole row name; e.g.
    CoRP's report also carries base and RandOpt rows, which RandOpt's own cells report)."""
    flops: tuple[str, ...] = ()
    """Dotted report paths summed into the cell's training/selection FLOPs."""
    equal_data: bool = False
    """In the equal-data setting, select/train on support + probe + validation (the labelled
    examples CoRP uses), instead of support alone."""
    unit: str | None = None
    """The option that grows with compute (population, iterations, steps)."""
    min_units: int = 1
    """Smallest unit count that is a meaningful run (a budget that cannot buy it is refused)."""
    unit_evals: Callable[[dict], float] = field(default=lambda opts: 1.0, compare=False)
    """Support-split evaluations per unit, from the resolved options (the bench turns it into a
    lower bound on FLOPs to refuse a budget below the minimum before any compute)."""
    clip: tuple[str, ...] = ()
    """List options whose values must not exceed the unit count (RandOpt's top-K <= N)."""
    units_done: str | None = None
    """Iterative methods: dotted report path of the units the reported model was trained for (the
    record's count, so a run directory trained further than asked is never labelled as asked)."""
    defaults: dict = field(default_factory=dict, compare=False)
    """Options the bench sets unless the config does (e.g. no extra evaluations a cell does not report)."""
    row_names: Callable[[dict], list[str]] | None = field(default=None, compare=False)
    """The report rows the method can produce from its options (None: one row, named by the cell's
    label); the bench refuses a comparison naming a row no method can report, before compute."""
    check: Callable[[object, dict], None] | None = field(default=None, compare=False)
    """A check of the cell's built config against its splits ({name: examples}) that needs no model
    (e.g. FGRPO: every client gets support examples); raises CorpError before any compute."""
    population_rows: str | None = None
    """Regex of the report rows that are RandOpt's on this method's own population (CoRP's report
    computes them); the bench keeps them as LABEL/ROW under `population_rows: true`."""
    touched: Callable[[dict, int, int | None], int | None] | None = field(default=None, compare=False)
    """Distinct labelled examples a run touches, from (its options, seed, units): those it scored or
    trained on (None: not known). Unset: every example of its splits but test (support + probe +
    validation)."""
    regime: dict = field(default_factory=dict, compare=False)
    """The regime it should reach at the bench's top budget (issue 39), each a least value: `units`
    (its unit) or an option of the cell (n_support, population); the bench's regime table reports it.
    A bench config's `regime_targets` replaces it. Empty: no target."""
    reached: Callable[[dict], str] | None = field(default=None, compare=False)
    """The regime a final cell reached, as the regime table says it, from {"units": mean units, and the
    cell's options}. None: by kind ("no training", "N specialists", "N optimizer steps")."""


def option_default(config: type, name: str):
    """The default of option `name` in a method's config dataclass (the cost rules read an option the
    cell left unset from the method's own default, never from a copy)."""
    f = next(f for f in dataclasses.fields(config) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def opt(options: dict, config: type, name: str):
    """A cell's option `name`, or the method's own default when the cell leaves it unset."""
    return options.get(name, option_default(config, name))


def labelled(options: dict) -> int:
    """Labelled examples of a cell's splits but test (support + probe + validation)."""
    return sum(int(options.get(k) or 0) for k in ("n_support", "n_probe", "n_validation"))


def ints(value) -> list[int]:
    """A list option (a list, or a comma-separated string) as ints."""
    return [] if value is None else [int(v) for v in comma_list(value) if str(v).strip()]


def get_path(report: dict, dotted: str) -> float:
    """The number at `dotted` (a.b.c) in a report; a missing path is 0 (the method spent nothing there)."""
    node = report
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node or node[part] is None:
            return 0.0
        node = node[part]
    return float(node)


# ---------------------------------------------------------------- the method


@dataclass(frozen=True)
class Method:
    """One method: what the registry, the CLI, the bench and the tests know about it."""

    name: str
    """Command name (`corp NAME`) and the report's `method` (variants may add a suffix: grpo-cov)."""
    config: type
    """Its config dataclass (a corp.config.RunConfig subclass)."""
    run: Callable[..., dict]
    """run(cfg[, backend]) -> report dict; writes report.json into cfg.run_dir."""
    help: str
    """One line for `corp --help`."""
    report: str = "report.json"
    """The file in the run directory its report goes to: report.json (schema corp.runtime.runs.REPORT_SCHEMA),
    except for an analysis that writes into the run it analyses, beside that run's own report."""
    recipes: tuple[str, ...] = ()
    """Kinds of recipe.json it may write (`corp.algorithms.recipe.RECIPE_KINDS`; `corp apply` rebuilds the model from it); () for none."""
    model: bool = False
    """Whether it saves a model directory (RUN_DIR/model, a Hugging Face model)."""
    smoke: dict[str, Any] | None = field(default=None, hash=False)
    """Options of its smallest meaningful run (a tiny model, a few examples): tests and bench smoke runs."""
    no_smoke: str | None = None
    """Why it cannot run on a tiny model, when `smoke` is None (never skipped silently)."""
    summary: Callable[[dict], str] | None = None
    """report -> text for the terminal; default: the report's table."""
    bench: BenchAdapter | None = field(default=None, hash=False)
    """How `corp bench` runs it at a budget; None: not a bench row."""
    product: str | None = None
    """What it makes, where that is named otherwise than the command (CoRP: `corp consolidate` makes
    `corp`): its report row, its recipe's made_by.method and its Python function `corp.train_<product>`.
    None: the command's name (`made`)."""

    def __post_init__(self):
        if (self.smoke is None) == (self.no_smoke is None):
            raise ValueError(f"method '{self.name}': give either smoke options or a no_smoke reason, exactly one")

    @property
    def takes_backend(self) -> bool:
        """Whether run() accepts a ready backend (tests, reuse) as its second argument."""
        return "backend" in inspect.signature(self.run).parameters

    @property
    def uses_population(self) -> bool:
        """Whether it scores (or reads, with --from-run) a population of specialists."""
        return issubclass(self.config, PopulationConfig)

    def __call__(self, cfg, backend=None) -> dict:
        if self.model and getattr(cfg, "run_dir", None):
            # RUN_DIR/model is saved at the end: a file there it may not replace is refused before any work
            check_output_dir(Path(cfg.run_dir) / "model")
        if backend is None:
            return self.run(cfg)
        if not self.takes_backend:
            raise TypeError(f"method '{self.name}': {self.run.__module__}.{self.run.__qualname__} takes no backend")
        return self.run(cfg, backend=backend)

    @property
    def made(self) -> str:
        """The name of what it makes (its `product`, else its command's name)."""
        return self.product or self.name

    def summarise(self, report: dict) -> str:
        """What the CLI prints after a run."""
        if self.summary:
            return self.summary(report)
        text = report.get("table") or report.get("text") or ""
        where = f"run directory: {report['run_dir']}" if report.get("run_dir") and "run directory" not in text else ""
        return "\n".join(t for t in (text, where) if t)


def num(value, fmt: str = ".3f") -> str:
    """A number for a summary line; 'n/a' when the report lacks it (an older report, a skipped stage)."""
    return format(value, fmt) if isinstance(value, (int, float)) else "n/a"
