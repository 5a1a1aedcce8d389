"""Bench adapters: how `corp bench` runs a registered method at a compute budget.

A method that takes part in the bench names its adapter in its registry line
(`Method(..., bench="corp.bench.adapters:RANDOPT")`); the sweep (corp.bench.sweep) only reads these
fields and never asks which method it is running. An adapter says:

- `kind`: how compute is matched.
  "fixed": the method spends no training or selection compute (the base, self-consistency); one
  cell per seed serves every budget.
  "population": the method reads a scored population (`--from-run` of the bench's shared `corp
  score` run of that seed and data setting); at budget B it gets the largest population prefix
  whose scoring FLOPs plus the method's own evaluations on it fit in B (`unit` = the option that
  sets the prefix length).
  "iterative": the method trains step by step and resumes on its run directory with a larger
  `unit` (ES iterations, GRPO steps); at budget B it is evaluated at its last checkpoint whose
  training ledger is at or below B (a method that cannot fit B is 'does not fit').
- `rows`: which rows of the method's report are its own (a regex on the row name; e.g. CoRP's
  report also carries base and RandOpt rows, which RandOpt's own cells report).
- `flops`: dotted paths in the report summed into the cell's training/selection FLOPs.
- `equal_data`: in the "equal-data" setting the method selects or trains on support + probe +
  validation (the labelled examples CoRP uses), instead of support alone.
- `min_units`: the smallest `unit` that means a run (a budget that cannot buy it is refused).
- `unit_evals`: support-split evaluations one unit costs, from the method's options (the bench
  turns it into a lower bound on FLOPs to refuse a budget below the minimum before any compute).
- `clip`: list options whose values may not exceed the unit count (RandOpt's top-K <= N).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from corp.baselines import (
    ESConfig,
    FERAConfig,
    FGRPOConfig,
    FTISConfig,
    GRPOConfig,
    SelfConsistencyConfig,
    iteration_batch,
)
from corp.config import RandOptConfig

FIXED, POPULATION, ITERATIVE = "fixed", "population", "iterative"


def _default(config: type, name: str):
    """The default of option `name` in a method's config dataclass (the cost rules below read an
    option the cell left unset from the method's own default, never from a copy)."""
    f = next(f for f in dataclasses.fields(config) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _opt(options: dict, config: type, name: str):
    """A cell's option `name`, or the method's own default when the cell leaves it unset."""
    return options.get(name, _default(config, name))


@dataclass(frozen=True)
class BenchAdapter:
    kind: str
    """fixed | population | iterative (see the module docstring)."""
    rows: str
    """Regex of the report rows that are this method's (matched against the whole row name)."""
    flops: tuple[str, ...] = ()
    """Dotted report paths summed into the cell's training/selection FLOPs."""
    equal_data: bool = False
    """In the equal-data setting, select/train on support + probe + validation."""
    unit: str | None = None
    """The option that grows with compute (population, iterations, steps)."""
    min_units: int = 1
    """Smallest unit count that is a meaningful run."""
    unit_evals: Callable[[dict], float] = field(default=lambda opts: 1.0, compare=False)
    """Support-split evaluations per unit, from the resolved options (for the minimum-budget check)."""
    clip: tuple[str, ...] = ()
    """List options whose values must not exceed the unit count."""
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


def _labelled(o: dict) -> int:
    return sum(int(o.get(k) or 0) for k in ("n_support", "n_probe", "n_validation"))


def _grpo_draws(prefix: str, seed: int, steps: int, n: int, k: int) -> int:
    """Distinct support positions drawn by `steps` steps of GRPO-style sampling:
    random.Random(f"{prefix}|{seed}|{step}").sample(support, min(k, n)) at steps 0..steps-1 (GRPO's
    `corp-grpo`, F-TIS's `corp-ftis`); random.sample picks positions by the list's length alone."""
    import random

    seen: set[int] = set()
    for step in range(steps):
        seen.update(random.Random(f"{prefix}|{seed}|{step}").sample(range(n), min(k, n)))
    return len(seen)


def _es_touched(o: dict, seed: int, units: int | None) -> int | None:
    """ES scores every member on its iteration's batch (corp.baselines.es.iteration_batch) or the whole support."""
    n = int(o.get("n_support") or 0)
    k = int(_opt(o, ESConfig, "prompts_per_iteration"))
    if not k or k >= n or units is None:
        return n
    support = list(range(n))
    c = SimpleNamespace(prompts_per_iteration=k, seed=seed)
    return len({i for t in range(units) for i in iteration_batch(c, support, t)})


def _ints(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else str(value).split(",")) if str(v).strip()]


SELF_CONSISTENCY = BenchAdapter(
    FIXED,
    r"base|self-consistency@\d+",
    row_names=lambda o: ["base"] + [f"self-consistency@{k}" for k in _ints(_opt(o, SelfConsistencyConfig, "k"))],
    touched=lambda o, seed, units: 0,
)
RANDOPT = BenchAdapter(
    POPULATION,
    r"randopt-top1|randopt-vote@\d+",
    flops=("population.selection_ledger.flops",),
    equal_data=True,
    unit="population",
    clip=("top_k",),
    row_names=lambda o: (
        ["randopt-top1"] + [f"randopt-vote@{k}" for k in _ints(_opt(o, RandOptConfig, "top_k")) if k != 1]
    ),
    touched=lambda o, seed, units: int(o.get("n_support") or 0),  # every specialist scored on the whole support
)
# CoRP needs two elites to merge anything; its own probe/validation/support-half evaluations count
# (probe, step search, gates: the cell's prefix is chosen so that population + these fit the budget);
# only the deployed merge rule is searched and gated (the others' gates only fed the report)
CORP = BenchAdapter(
    POPULATION,
    r"corp.*",
    flops=("population.selection_ledger.flops", "corp.consolidation_ledger.flops"),
    unit="population",
    min_units=2,
    clip=("top_k",),
    defaults={"top_k": [1], "merge_rules": ["pass2"]},
    population_rows=r"randopt-top1|randopt-vote@\d+",
    touched=lambda o, seed, units: _labelled(o),  # support (scoring), probe (step search), validation (gate)
)


def _es_support_share(o) -> float:
    """The share of a support pass one ES evaluation costs: prompts_per_iteration of n_support (0: all)."""
    k, n = int(_opt(o, ESConfig, "prompts_per_iteration")), max(1, int(_opt(o, ESConfig, "n_support")))
    return min(k, n) / n if k else 1.0


# one ES iteration scores `population` specialists and (unless skipped) the centre, each on
# prompts_per_iteration support examples (0: all of them)
ES = BenchAdapter(
    ITERATIVE,
    r"es",
    flops=("training_ledger.flops",),
    equal_data=True,
    unit="iterations",
    units_done="iterations",
    unit_evals=lambda o: (
        (float(_opt(o, ESConfig, "population")) + (0.0 if _opt(o, ESConfig, "skip_centre_eval") else 1.0))
        * _es_support_share(o)
    ),
    touched=_es_touched,
)
# one GRPO step generates prompts_per_step * num_generations completions (a fraction of a support pass)
GRPO = BenchAdapter(
    ITERATIVE,
    r"grpo-.*",
    flops=("training_ledger.flops",),
    equal_data=True,
    unit="steps",
    units_done="steps",
    unit_evals=lambda o: (
        float(_opt(o, GRPOConfig, "prompts_per_step"))
        * float(_opt(o, GRPOConfig, "num_generations"))
        / max(1.0, float(_opt(o, GRPOConfig, "n_support")))
    ),
    touched=lambda o, seed, units: (
        None
        if units is None
        else _grpo_draws(
            "corp-grpo", seed, units, int(o.get("n_support") or 0), int(_opt(o, GRPOConfig, "prompts_per_step"))
        )
    ),
)


# one FGRPO round: every client runs `steps` local GRPO steps of prompts_per_step * num_generations completions
def _clients_get_support(cfg, splits: dict) -> None:
    from corp.clients import split_clients

    split_clients(splits["support"], cfg.clients, cfg.split_by, "support")


FGRPO = BenchAdapter(
    ITERATIVE,
    r"fgrpo",
    flops=("method_flops",),
    equal_data=True,
    unit="rounds",
    units_done="rounds",
    unit_evals=lambda o: (
        float(_opt(o, FGRPOConfig, "clients"))
        * float(_opt(o, FGRPOConfig, "steps"))
        * float(_opt(o, FGRPOConfig, "prompts_per_step"))
        * float(_opt(o, FGRPOConfig, "num_generations"))
        / max(1.0, float(_opt(o, FGRPOConfig, "n_support")))
    ),
    check=_clients_get_support,
    touched=lambda o, seed, units: None,  # each client samples its own share: not reconstructed here
)


# F-TIS: node 0 (the bench's model) learns beside the other nodes (e.g. Gemma 3 270M); one step = every
# node generates prompts_per_step * num_generations completions, computes their logprobs, and trains on
# the mixed group. The cell's FLOPs are every node's (`method_flops`, each at its own model's size);
# the row is node 0's model. Node 0 alone is evaluated on test, and the GRPO comparison arm (GRPO has
# its own cells) is not run: both would only feed F-TIS's own report.
def _ftis_nodes(o: dict) -> int:
    nodes = o.get("nodes", _default(FTISConfig, "nodes"))
    names = [n for n in (nodes if isinstance(nodes, (list, tuple)) else str(nodes).split(",")) if str(n).strip()]
    return len(names) or int(_opt(o, FTISConfig, "n_nodes"))


def _ftis_nodes_usable(cfg, splits: dict) -> None:
    """Before compute: node 0 is the bench's model (F-TIS's row is node 0's), and every node's model
    resolves (a partner that is not installed, e.g. gemma3-270m without `make gemma`, is one line
    here instead of a failure at the first F-TIS cell)."""
    from corp import CorpError
    from corp.models import resolve_model

    names = cfg.node_models()
    if names[0] != cfg.model:
        raise CorpError(
            f"--nodes '{cfg.nodes}' starts with '{names[0]}', but the bench's model is '{cfg.model}' and F-TIS's "
            "row is node 0's model; put the bench's model first"
        )
    for k, name in enumerate(names):
        try:
            resolve_model(name)  # converts an embedded model once; later calls only find it
        except CorpError as exc:
            raise CorpError(f"node {k} ('{name}'): {exc}") from None


FTIS = BenchAdapter(
    ITERATIVE,
    r"node0-ftis",
    flops=("method_flops",),
    equal_data=True,
    unit="steps",
    units_done="steps",
    # a lower bound at the bench model's size: every node generates its completions on a share of support
    unit_evals=lambda o: (
        _ftis_nodes(o)
        * float(_opt(o, FTISConfig, "prompts_per_step"))
        * float(_opt(o, FTISConfig, "num_generations"))
        / max(1.0, float(_opt(o, FTISConfig, "n_support")))
    ),
    defaults={"skip_grpo_baseline": True, "eval_nodes": "0", "eval_every": 1_000_000_000},
    check=_ftis_nodes_usable,
    touched=lambda o, seed, units: (
        None
        if units is None
        else _grpo_draws(
            "corp-ftis", seed, units, int(o.get("n_support") or 0), int(_opt(o, FTISConfig, "prompts_per_step"))
        )
    ),
)
# FERA trains nothing: its rounds cost inference only, reported per row as passes per test example
FERA = BenchAdapter(
    FIXED,
    r"fera-round\d+|plain-vote-round\d+",
    row_names=lambda o: [
        f"{p}-round{r}" for r in range(1, int(_opt(o, FERAConfig, "rounds")) + 1) for p in ("fera", "plain-vote")
    ],
    touched=lambda o, seed, units: None,
)

# Methods docs/methods.md describes that are not built yet: a bench config may name them; they are
# listed as missing in the results, never silently skipped. A registered method whose registry line
# names no adapter is listed the same way (corp.bench.sweep.plan), as fedcorp is (registered, no adapter).
PLANNED: dict[str, str] = {}


def get_path(report: dict, dotted: str) -> float:
    """The number at `dotted` (a.b.c) in a report; a missing path is 0 (the method spent nothing there)."""
    node = report
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node or node[part] is None:
            return 0.0
        node = node[part]
    return float(node)
