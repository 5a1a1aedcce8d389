"""CoRP consolidation (`corp consolidate`): score or reuse a population, fold it into one gated model
with the CoRP operator (the core package `corp/algorithms/corp_operator/`, which `corp fedcorp` runs too), stage 2,
low-rank consolidation, the recipe and the report.

The names below are this package's public surface: code outside `corp.methods.consolidate` imports them
from here (`from corp.methods.consolidate import run_consolidate`), never from a submodule (tests/test_layers.py).
The recipe (`make_recipe`, `apply_recipe`, ...) is the core module `corp/algorithms/recipe.py`.
"""

from corp.method import POPULATION, SMALL, BenchAdapter, Method, labelled
from corp.methods.consolidate.config import COMMAND, PRODUCT, ConsolidateConfig
from corp.methods.consolidate.run import run_consolidate

METHOD = Method(
    COMMAND,
    ConsolidateConfig,
    run_consolidate,
    "CoRP: consolidate a rewarded population into one gated model (recipe.json + model/).",
    recipes=("corp-direction", "low-rank"),
    model=True,
    product=PRODUCT,
    smoke={**SMALL, "population": 4, "sigmas": "0.05", "alphas": "1,2", "top_k": "1,2"},
    # CoRP needs two elites to merge anything; its own probe/validation/support-half evaluations count
    # (probe, step search, gates: the cell's prefix is chosen so that population + these fit the budget);
    # only the deployed merge rule is searched and gated (the others' gates only fed the report)
    bench=BenchAdapter(
        POPULATION,
        rf"{PRODUCT}.*",
        flops=("population.selection_ledger.flops", f"{PRODUCT}.consolidation_ledger.flops"),
        unit="population",
        min_units=2,
        clip=("top_k",),
        defaults={"top_k": [1], "merge_rules": ["pass2"]},
        population_rows=r"randopt-top1|randopt-vote@\d+",
        touched=lambda o, seed, units: labelled(o),  # support (scoring), probe (step search), validation (gate)
        regime={"units": 200, "n_support": 64},  # issue 39: at least 200 specialists on at least 64 support examples
        reached=lambda got: f"{got['units']:.3g} specialists on {got.get('n_support', '?')} support",
    ),
)

__all__ = ["METHOD", "PRODUCT", "ConsolidateConfig", "run_consolidate"]
