"""`--loss grpo`: plain GRPO (DeepSeekMath, arXiv 2402.03300), TRL's GRPOTrainer loss; no departures."""

from corp.baselines.grpo.base import LossVariant


class PlainGRPO(LossVariant):
    name = "grpo"
