"""`--loss cov`: covariance-weighted GRPO — "Taming Extreme Tokens" (arXiv 2605.11538).
Reconstruction (docs/methods.md, "Covariance-weighted GRPO"; the paper publishes no code).

Per valid token t of the batch: c_t = (logp_t - mean logp) (A_t - mean A), the means over the
batch's valid tokens; sigma = the standard deviation of the c_t over the same tokens;
w_t = exp(-c_t^2 / (2 sigma^2)) -- c itself, not centred again inside the kernel -- detached, then
normalised to mean 1 over the valid tokens (w_t N / sum w). The per-token GRPO loss is w_t L_t.
Tokens whose log-probability and advantage deviate together (the "extreme" ones that dominate the
policy-gradient covariance) take smaller steps; the average step size stays GRPO's. No
hyperparameters. Policy entropy is logged every step by the core (all variants).

Choices where the description leaves room:
- "the batch" is the micro-batch the loss is computed on (with --gradient-accumulation-steps 1, the whole step);
- logp_t is the current policy's logprob (detached; equal to the behaviour policy's on-policy);
- sigma is the population standard deviation (divide by N); when it is 0 (every c_t equal, e.g.
  all advantages 0) the weights are all 1: plain GRPO.
"""

from __future__ import annotations

import torch

from corp.algorithms.grpo.base import LossVariant, register_loss, valid_mean


def covariance_weights(adv: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w (B, T), mean 1 over the valid tokens, 0 elsewhere."""
    m = mask.to(logps.dtype)
    a, lp = adv.detach(), logps.detach()
    c = (lp - valid_mean(lp, m)) * (a - valid_mean(a, m))
    var = valid_mean((c - valid_mean(c, m)) ** 2, m)
    if not var > 1e-24:
        return m.clone()
    logw = -(c**2) / (2 * var)
    # shift by the largest valid log-weight before exp: the normalisation cancels the shift, and
    # nearly equal nonzero c (sigma << |c|) would otherwise underflow every weight to 0
    logw = logw - logw.masked_fill(m == 0, -torch.inf).max()
    w = torch.exp(logw) * m
    return w * (m.sum() / w.sum())


@register_loss
class CovGRPO(LossVariant):
    name = "cov"

    def token_weights(self, logps, adv, mask):
        w = covariance_weights(adv, logps, mask)
        self.last_stats = {"cov_weight_min": float(w[mask.bool()].min()) if mask.any() else 1.0}
        return w
