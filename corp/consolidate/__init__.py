"""CoRP consolidation: fold a rewarded population into one gated model (see corp_operator.py).

The names below are this package's public surface: code outside `corp.consolidate` imports them
from here (`from corp.consolidate import make_recipe`), never from a submodule (tests/test_layers.py).
"""

from corp.consolidate.config import ConsolidateConfig, OperatorConfig
from corp.consolidate.corp_operator import merge_and_search
from corp.consolidate.gate import paired_gate
from corp.consolidate.recipe import apply_recipe, make_recipe, produced_weights, write_recipe
from corp.consolidate.run import run_consolidate

__all__ = [
    "ConsolidateConfig",
    "OperatorConfig",
    "apply_recipe",
    "make_recipe",
    "merge_and_search",
    "paired_gate",
    "produced_weights",
    "run_consolidate",
    "write_recipe",
]
