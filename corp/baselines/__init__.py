"""Methods to compare: RandOpt, ES, GRPO and its loss variants, self-consistency, F-TIS, FGRPO, FERA.

The names below are this package's public surface: code outside `corp.baselines` imports them from
here (the method registry: `from corp.baselines import run_es`), never from a submodule
(tests/test_layers.py).
"""

from corp.baselines.es import ESConfig, iteration_batch, run_es
from corp.baselines.fera import FERAConfig, run_fera
from corp.baselines.fera import summary as fera_summary
from corp.baselines.fgrpo import FGRPOConfig, run_fgrpo
from corp.baselines.ftis import FTISConfig, run_ftis
from corp.baselines.ftis import summary as ftis_summary
from corp.baselines.grpo.core import GRPOConfig, run_grpo
from corp.baselines.randopt import run_randopt
from corp.baselines.self_consistency import SelfConsistencyConfig, run_self_consistency

__all__ = [
    "ESConfig",
    "FERAConfig",
    "FGRPOConfig",
    "FTISConfig",
    "GRPOConfig",
    "SelfConsistencyConfig",
    "fera_summary",
    "iteration_batch",
    "ftis_summary",
    "run_es",
    "run_fera",
    "run_fgrpo",
    "run_ftis",
    "run_grpo",
    "run_randopt",
    "run_self_consistency",
]
