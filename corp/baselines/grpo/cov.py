"""`--loss cov`: covariance-weighted GRPO — "Taming Extreme Tokens" (arXiv 2605.11538). Reconstruction.

Token covariance c_t = (A_t - mean A) (logp_t - mean logp), means over the valid tokens of the
batch; z-score c over the batch; weight w_t = exp(-z_t^2 / 2), detached; the loss uses w_t A_t.
No hyperparameters. Policy entropy is logged every step by the core (all variants).

Departures / choices (the paper's exact rule was not available; METHODS.md specifies this form):
- "the batch" is the micro-batch the loss is computed on (with --grad-accum 1, the whole step);
- logp_t is the current policy's logprob (detached), the z-score uses the population std with a
  1e-8 floor, so an all-equal batch gives w = 1 everywhere (plain GRPO).
"""

from __future__ import annotations

import torch

from corp.baselines.grpo.base import LossVariant


def covariance_weights(adv: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(logps.dtype)
    n = m.sum().clamp(min=1.0)
    a, lp = adv.detach(), logps.detach()
    c = (a - (a * m).sum() / n) * (lp - (lp * m).sum() / n)
    mean_c = (c * m).sum() / n
    std_c = (((c - mean_c) ** 2 * m).sum() / n).sqrt()
    z = (c - mean_c) / std_c.clamp(min=1e-8)
    return torch.exp(-0.5 * z**2) * m


class CovGRPO(LossVariant):
    name = "cov"

    def token_weights(self, adv, logps, mask):
        w = covariance_weights(adv, logps, mask)
        n = mask.sum().clamp(min=1.0)
        self.last_stats = {"cov_weight_mean": float((w * mask).sum() / n)}
        return w
