"""`--loss reco`: ReCo, reweighting for coverage (Pass@k at large k). Reconstruction (METHODS.md).

Response level: omega_i = 1 / (G p_i), p_i = the length-normalised sequence probability
exp(mean_t logp_old,t) of completion i under the behaviour policy, normalised so the weights of a
group sum to G, detached: rare completions count more, frequent ones less.
Token level: the importance ratio is replaced by the variance ratio
v_t = p_t (1 - p_t) / (p_old,t (1 - p_old,t)), clipped like the ratio.

Departures / choices: p_old (1 - p_old) is floored at 1e-8 to keep v finite for p_old -> 1;
p_i uses only completion tokens; an empty completion gets p_i = 1.
"""

from __future__ import annotations

import torch

from corp.baselines.grpo.base import LossVariant


def occurrence_weights(logps: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    m = mask.to(logps.dtype)
    mean_lp = (logps.detach() * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    inv = torch.exp(-mean_lp) / group_size  # 1 / (G p_i)
    grouped = inv.view(-1, group_size)
    return (grouped / grouped.sum(dim=1, keepdim=True) * group_size).reshape(-1)


class ReCo(LossVariant):
    name = "reco"
    needs_response_logps = True

    def ratio(self, logps, old_logps):
        p, p_old = logps.exp(), old_logps.exp()
        return p * (1 - p) / (p_old * (1 - p_old)).clamp(min=1e-8)

    def response_weights(self, batch, logps, group_size):
        w = occurrence_weights(logps, batch.completion_mask, group_size)
        self.last_stats = {"reco_weight_max": float(w.max())}
        return w
