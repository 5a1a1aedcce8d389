"""The method registry: every method corp runs, by name, registered once.

In the spirit of mergekit's merge-method registry and evosax's `Strategies`: a method is a config
dataclass (a `corp.config.RunConfig` subclass, one docstring per field) plus a run function
`run(cfg) -> report dict` that writes `report.json` (schema `corp.runs.REPORT_SCHEMA`; an analysis
written into the run it analyses names its own file), and where the method makes one,
`recipe.json` and a model directory, into the run directory. The CLI makes
one `corp NAME` command per entry (options generated from the config's fields), `corp bench`
iterates over the entries, and tests/test_methods.py runs every entry on a tiny random model.

Adding a method is one file (its config and run function, next to the algorithm) plus one line in
METHODS below. Entries hold their config class and run function themselves (real imports, from each
algorithm package's public surface), so the import graph shows what the registry depends on; the
bench adapter alone is named as 'module:attribute', because corp.bench sits above this layer.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corp.analysis import AnalyzeRankConfig, run_analyze_rank
from corp.baselines import (
    ESConfig,
    FERAConfig,
    FGRPOConfig,
    FTISConfig,
    GRPOConfig,
    SelfConsistencyConfig,
    fera_summary,
    ftis_summary,
    run_es,
    run_fera,
    run_fgrpo,
    run_ftis,
    run_grpo,
    run_randopt,
    run_self_consistency,
)
from corp.config import PopulationConfig, RandOptConfig
from corp.consolidate import ConsolidateConfig, run_consolidate
from corp.evaluate.passk import EvalConfig, run_eval
from corp.federated import FedCorpConfig, run_fedcorp
from corp.methods import summaries
from corp.methods.score import run_score
from corp.registry import Registry

# split sizes of a smoke run: every split non-empty, so any method finds what it needs
_SMALL = {"n_support": 4, "n_probe": 4, "n_validation": 4, "n_test": 4, "max_new_tokens": 4, "batch_size": 8}


@dataclass(frozen=True)
class Method:
    """One registered method."""

    name: str
    """Command name (`corp NAME`) and the report's `method` (variants may add a suffix: grpo-cov)."""
    config: type
    """Its config dataclass (a corp.config.RunConfig subclass)."""
    run: Callable[..., dict]
    """run(cfg[, backend]) -> report dict; writes report.json into cfg.run_dir."""
    help: str
    """One line for `corp --help`."""
    report: str = "report.json"
    """The file in the run directory its report goes to: report.json (schema corp.runs.REPORT_SCHEMA),
    except for an analysis that writes into the run it analyses, beside that run's own report."""
    recipes: tuple[str, ...] = ()
    """Kinds of recipe.json it may write (`corp.recipe.RECIPE_KINDS`; `corp apply` rebuilds the model from it); () for none."""
    model: bool = False
    """Whether it saves a model directory (RUN_DIR/model, a Hugging Face model)."""
    smoke: dict[str, Any] | None = field(default=None, hash=False)
    """Options of its smallest meaningful run (a tiny model, a few examples): tests and bench smoke runs."""
    no_smoke: str | None = None
    """Why it cannot run on a tiny model, when `smoke` is None (never skipped silently)."""
    summary: Callable[[dict], str] | None = None
    """report -> text for the terminal; default: the report's table."""
    bench: str | None = None
    """'module:attr' of its `corp.bench.adapters.BenchAdapter` (how `corp bench` runs it at a budget); None: not a bench row."""

    def __post_init__(self):
        if (self.smoke is None) == (self.no_smoke is None):
            raise ValueError(f"method '{self.name}': give either smoke options or a no_smoke reason, exactly one")

    @property
    def config_class(self) -> type:
        return self.config

    @property
    def run_function(self) -> Callable[..., dict]:
        return self.run

    @property
    def bench_adapter(self):
        """Its BenchAdapter, or None when `corp bench` does not run it."""
        return _resolve(self.bench) if self.bench else None

    @property
    def takes_backend(self) -> bool:
        """Whether run() accepts a ready backend (tests, reuse) as its second argument."""
        return "backend" in inspect.signature(self.run_function).parameters

    @property
    def uses_population(self) -> bool:
        """Whether it scores (or reads, with --from-run) a population of specialists."""
        return issubclass(self.config_class, PopulationConfig)

    def __call__(self, cfg, backend=None) -> dict:
        if backend is None:
            return self.run_function(cfg)
        if not self.takes_backend:
            raise TypeError(f"method '{self.name}': {self.run.__module__}.{self.run.__qualname__} takes no backend")
        return self.run_function(cfg, backend=backend)

    def summarise(self, report: dict) -> str:
        """What the CLI prints after a run."""
        if self.summary:
            return self.summary(report)
        text = report.get("table") or report.get("text") or ""
        where = f"run directory: {report['run_dir']}" if report.get("run_dir") and "run directory" not in text else ""
        return "\n".join(t for t in (text, where) if t)


def _resolve(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


# ---------------------------------------------------------------- the registry: one line per method

METHODS: tuple[Method, ...] = (
    Method(
        "score",
        PopulationConfig,
        run_score,
        "Score a population of perturbed specialists on the support split (population.jsonl).",
        smoke={**_SMALL, "population": 3, "sigmas": "0.05"},
        summary=summaries.score,
    ),
    Method(
        "randopt",
        RandOptConfig,
        run_randopt,
        "RandOpt: score N perturbed specialists, report base, top-1 and top-K vote on the test split.",
        smoke={**_SMALL, "population": 3, "sigmas": "0.05", "top_k": "1,2"},
        bench="corp.bench.adapters:RANDOPT",
    ),
    Method(
        "consolidate",
        ConsolidateConfig,
        run_consolidate,
        "CoRP: consolidate a rewarded population into one gated model (recipe.json + model/).",
        recipes=("corp-direction", "low-rank"),
        model=True,
        smoke={**_SMALL, "population": 4, "sigmas": "0.05", "alphas": "1,2", "top_k": "1,2"},
        bench="corp.bench.adapters:CORP",
    ),
    Method(
        "es",
        ESConfig,
        run_es,
        "ES: iterative OpenES around a moving centre; saves the model and its seed recipe, reports test accuracy.",
        recipes=("es",),
        model=True,
        smoke={**_SMALL, "iterations": 2, "population": 4, "sigma": 0.05, "alpha": 0.05},
        summary=summaries.es,
        bench="corp.bench.adapters:ES",
    ),
    Method(
        "grpo",
        GRPOConfig,
        run_grpo,
        "GRPO (TRL-style) with loss variants grpo | cov | reco; full-parameter or LoRA; saves an HF model directory.",
        model=True,
        smoke={
            **_SMALL,
            "steps": 2,
            "prompts_per_step": 2,
            "num_generations": 2,
            "checkpoint_every": 1,
            "learning_rate": 1e-3,
        },
        summary=summaries.grpo,
        bench="corp.bench.adapters:GRPO",
    ),
    Method(
        "eval",
        EvalConfig,
        run_eval,
        "Evaluate a model on the test split: greedy accuracy; pass@k from n samples per problem with --pass-k.",
        smoke={**_SMALL, "pass_k": "1,2", "n_samples": 2},
    ),
    Method(
        "self-consistency",
        SelfConsistencyConfig,
        run_self_consistency,
        "Self-consistency@K: sample the base model K times per question "
        "(temperature 0.7), majority vote; greedy base beside it.",
        smoke={**_SMALL, "k": "1,2"},
        bench="corp.bench.adapters:SELF_CONSISTENCY",
    ),
    Method(
        "fedcorp",
        FedCorpConfig,
        run_fedcorp,
        "Federated weight space: K clients score the same seeds on private data; "
        "only (seed, reward) pairs, candidates and verdicts travel; CoRP stage 1 "
        "on the combined rewards, gated by each client (recipe.json + model/).",
        recipes=("corp-direction",),
        model=True,
        smoke={
            **_SMALL,
            "population": 4,
            "sigmas": "0.05",
            "alphas": "1,2",
            "clients": 2,
            "split_by": "iid",
            "gate_z": -10.0,
        },
    ),
    Method(
        "fgrpo",
        FGRPOConfig,
        run_fgrpo,
        "FGRPO: K clients run E local GRPO steps per round on private non-IID "
        "shares; the server aggregates updates by relative reward gain (or FedAvg).",
        model=True,
        smoke={
            **_SMALL,
            "rounds": 2,
            "steps": 1,
            "clients": 2,
            "split_by": "iid",
            "prompts_per_step": 2,
            "num_generations": 2,
            "lora_r": 2,
            "learning_rate": 1e-3,
        },
        bench="corp.bench.adapters:FGRPO",
    ),
    Method(
        "analyze-rank",
        AnalyzeRankConfig,
        run_analyze_rank,
        "Split-half low-rank analysis of a scored population (--from-run DIR, or --model/--task/--population to score "
        "first): reproducible rank r* per weight matrix.",
        report="rank_summary.json",
        smoke={
            **_SMALL,
            "population": 4,
            "sigmas": "0.05",
            "ranks": "1,2",
            "splits": 2,
            "permutations": 19,
            "power_sims": 4,
        },
        summary=summaries.analyze_rank,
    ),
    Method(
        "ftis",
        FTISConfig,
        run_ftis,
        "F-TIS (reconstruction): nodes with their own models share rollouts + logprobs; GRPO on the mixed group with "
        "truncated importance weights and a KL filter; vs on-policy GRPO per node.",
        smoke={**_SMALL, "steps": 2, "prompts_per_step": 2, "num_generations": 2, "learning_rate": 1e-3},
        summary=ftis_summary,
        bench="corp.bench.adapters:FTIS",
    ),
    Method(
        "fera",
        FERAConfig,
        run_fera,
        "FERA (reconstruction, cheap variant): training-free rounds; clients answer with private demonstrations + the "
        "server's synthesis; uncertainty-weighted vote.",
        smoke={**_SMALL, "clients": 2, "shots": 1, "rounds": 2, "samples": 2},
        summary=fera_summary,
        bench="corp.bench.adapters:FERA",
    ),
)

REGISTRY: Registry[Method] = Registry("method")
for _m in METHODS:
    REGISTRY.register(_m)  # a second method under one name is an error at import


def get_method(name: str) -> Method:
    """The registered method `name`; an unknown name is one line listing the known ones."""
    return REGISTRY.lookup(name)


def methods() -> tuple[Method, ...]:
    return METHODS


__all__ = ["METHODS", "REGISTRY", "Method", "get_method", "methods"]
