"""`--loss grpo`: plain GRPO — Shao et al., "DeepSeekMath" (arXiv 2402.03300), as TRL's
GRPOTrainer computes it. No departures: no reweighting; the loss equals TRL's on identical inputs
(tests/test_grpo.py)."""

from corp.algorithms.grpo.base import LossVariant, register_loss


@register_loss
class PlainGRPO(LossVariant):
    name = "grpo"
