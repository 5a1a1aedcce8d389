"""GRPO and its loss variants on one trainer core (core.py); one file per variant, registered by
name with `@register_loss` (base.py). A new variant: add its file and its module to the import
line below."""

# isort: off
# base first, then the variants: importing registers them, in this order (the order `--loss` lists them)
from corp.baselines.grpo.base import LOSS_VARIANTS, LossVariant, get_loss, register_loss
from corp.baselines.grpo import plain, cov, reco  # noqa: E402,F401  (the registry line: importing registers)
# isort: on

__all__ = ["LOSS_VARIANTS", "LossVariant", "get_loss", "register_loss"]
