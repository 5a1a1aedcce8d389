"""`--loss reco`: ReCo, reweighting for coverage (Pass@k at large k). Reconstruction (docs/methods.md,
"ReCo"; no paper text or code was available to check it against).

Response level: omega_i = 1 / (G p_i), p_i = exp(mean_t logp_old,t) the length-normalised sequence
probability of completion i under the behaviour policy, normalised so a group's weights sum to G,
detached: rare completions count more, frequent ones less.
Token level: v_t = p_t (1 - p_t), detached, divided by its mean over the batch's valid tokens (so
the average scale is 1) and clipped to [0, v_max], v_max = 4: larger steps where alternatives
remain plausible (p_t near 1/2), smaller where the token is saturated.
Per-token loss: omega_i v_t L_t, L_t GRPO's clipped-ratio loss with the usual ratio
exp(logp - logp_old). Both weights are >= 0, so every token moves the way GRPO moves it.

Why not the earlier form: an earlier docs/methods.md text (and this file) used v_t / v_old,t as the
ratio inside the surrogate. Its gradient on-policy is (1 - 2 p_t) / (1 - p_t) times GRPO's, so a
confident token (p_t > 1/2) with positive advantage was pushed down (issue 10). tests/test_grpo.py
checks that one update raises a p = 0.9 token with A > 0.

Choices where the description leaves room: "the batch" is the micro-batch the loss is computed on;
p_t is the current policy's probability (detached; equal to the behaviour policy's on-policy);
p_i uses only completion tokens, and an empty completion gets p_i = 1.
"""

from __future__ import annotations

import torch

from corp.algorithms.grpo.base import LossVariant, register_loss, valid_mean

V_MAX = 4.0  # docs/methods.md: the clip of the normalised variance weight


def occurrence_weights(logps: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """omega (B,): 1 / (G p_i), normalised to sum G within each group of `group_size` rows."""
    m = mask.to(logps.dtype)
    mean_lp = (logps.detach() * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    inv = torch.exp(-mean_lp) / group_size  # 1 / (G p_i)
    grouped = inv.view(-1, group_size)
    return (grouped / grouped.sum(dim=1, keepdim=True) * group_size).reshape(-1)


def variance_weights(logps: torch.Tensor, mask: torch.Tensor, v_max: float = V_MAX) -> torch.Tensor:
    """v (B, T): p (1 - p) over its mean on the valid tokens, clipped to [0, v_max]; 0 off the mask.
    All-saturated tokens (mean 0) give weight 0: there is nothing left to move."""
    m = mask.to(logps.dtype)
    p = logps.detach().exp()
    v = p * (1 - p) * m
    mean = valid_mean(v, m)
    if not mean > 0:
        return torch.zeros_like(v)
    return (v / mean).clamp(0.0, v_max) * m


@register_loss
class ReCo(LossVariant):
    name = "reco"
    needs_response_logps = True

    def token_weights(self, logps, adv, mask):
        v = variance_weights(logps, mask)
        self.last_stats["reco_token_weight_max"] = float(v.max()) if v.numel() else 0.0
        return v

    def response_weights(self, batch, logps, group_size):
        w = occurrence_weights(logps, batch.completion_mask, group_size)
        self.last_stats = {"reco_weight_max": float(w.max())}
        return w
