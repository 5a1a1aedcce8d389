"""The GRPO trainer (trainer.py) and its loss variants, in the core because GRPO, F-TIS and FGRPO
train with it (and FERA scores with its log-probabilities); one file per variant, registered by
name with `@register_loss` (base.py). A new variant: add its file and its module to the import
line below."""

# isort: off
# base first, then the variants: importing registers them, in this order (the order `--loss` lists them)
from corp.algorithms.grpo.base import LOSS_VARIANTS, LossVariant, get_loss, register_loss
from corp.algorithms.grpo import plain, cov, reco  # noqa: E402,F401  (the registry line: importing registers)
from corp.algorithms.grpo.trainer import GRPOConfig, GRPOTrainer  # noqa: E402
# isort: on

__all__ = ["LOSS_VARIANTS", "GRPOConfig", "GRPOTrainer", "LossVariant", "get_loss", "register_loss"]
