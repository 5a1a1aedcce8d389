"""CoRP consolidation (`corp consolidate`): score or reuse a population, fold it into one gated model
with the CoRP operator (the core package `corp/operator/`, which `corp fedcorp` runs too), stage 2,
low-rank consolidation, the recipe and the report.

The names below are this package's public surface: code outside `corp.consolidate` imports them
from here (`from corp.consolidate import run_consolidate`), never from a submodule (tests/test_layers.py).
The recipe (`make_recipe`, `apply_recipe`, ...) is the core module `corp/recipe.py`.
"""

from corp.consolidate.config import ConsolidateConfig
from corp.consolidate.run import run_consolidate

__all__ = ["ConsolidateConfig", "run_consolidate"]
