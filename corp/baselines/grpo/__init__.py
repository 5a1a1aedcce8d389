"""GRPO and its loss variants on one trainer core (core.py); one file per variant."""

from corp.baselines.grpo.cov import CovGRPO
from corp.baselines.grpo.plain import PlainGRPO
from corp.baselines.grpo.reco import ReCo

VARIANTS = {"grpo": PlainGRPO, "cov": CovGRPO, "reco": ReCo}

__all__ = ["VARIANTS", "PlainGRPO", "CovGRPO", "ReCo"]
