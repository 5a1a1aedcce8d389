"""GRPO and its loss variants on one trainer core (core.py); one file per variant, registered by
name with `@register_loss` (base.py). A new variant: add its file and its module to the import
line below."""

from corp.baselines.grpo import cov, plain, reco  # noqa: E402,F401  (the registry line: importing registers)
from corp.baselines.grpo.base import LOSS_VARIANTS, LossVariant, get_loss, register_loss

__all__ = ["LOSS_VARIANTS", "LossVariant", "get_loss", "register_loss"]
