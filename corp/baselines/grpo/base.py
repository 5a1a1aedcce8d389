"""The loss-variant interface: what a GRPO variant may change, and the plain-GRPO defaults.

A variant supplies (all weights are detached by the core):
- `ratio(logps, old_logps)`: the per-token importance ratio that is clipped (GRPO: exp(logp - logp_old));
- `token_weights(adv, logps, mask)`: per-token weights multiplying the advantage, or None;
- `response_weights(batch, logps, group_size)`: per-sequence weights multiplying the advantage, or
  None; `logps` are the behaviour policy's per-token logprobs when `needs_response_logps` is set.
`last_stats` holds scalars the variant wants logged for the last micro-batch.
"""

from __future__ import annotations

import torch


class LossVariant:
    name = "grpo"
    needs_response_logps = False

    def __init__(self):
        self.last_stats: dict[str, float] = {}

    def ratio(self, logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
        return torch.exp(logps - old_logps)

    def token_weights(self, adv: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        return None

    def response_weights(self, batch, logps: torch.Tensor | None, group_size: int) -> torch.Tensor | None:
        return None
