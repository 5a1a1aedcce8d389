"""The GRPO loss-variant interface and its registry.

The core (core.py) computes GRPO's clipped-ratio per-token loss
L_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t), rho_t = exp(logp_t - logp_old,t),
and a variant may only reweight it: the policy-gradient part of the per-token loss becomes
omega_i * w_t * L_t, with
- `response_weights(batch, behaviour_logps, group_size)` -> omega (B,), or None (all 1); the core
  passes the behaviour policy's per-token logprobs when `needs_response_logps` is set;
- `token_weights(logps, adv, mask)` -> w (B, T), or None (all 1); `logps` are the current policy's
  per-token logprobs and `adv` the advantages broadcast per token, both already detached.
The core detaches both weights, so a variant changes the size of each token's step, never its
sign (weights are >= 0). The KL penalty (beta > 0) is not reweighted. `last_stats` holds scalars
the variant wants logged for the last micro-batch.

Adding a variant is one new file in this package plus one registry line: decorate the class with
`@register_loss` (its `name` is what `--loss` takes) and add the module to the import line in
`corp/algorithms/grpo/__init__.py`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from corp.registry import Registry

# --loss name -> variant class, filled by @register_loss
LOSS_VARIANTS: Registry[type[LossVariant]] = Registry(
    "GRPO loss variant", unknown="--loss '{name}' is unknown; choose one of {known}"
)


class LossVariant:
    name: ClassVar[str] = ""
    needs_response_logps: ClassVar[bool] = False

    def __init__(self):
        self.last_stats: dict[str, float] = {}

    def token_weights(self, logps: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        return None

    def response_weights(self, batch, logps: torch.Tensor | None, group_size: int) -> torch.Tensor | None:
        return None


def register_loss(cls: type[LossVariant]) -> type[LossVariant]:
    """Class decorator: make `cls` available as `--loss cls.name`."""
    return LOSS_VARIANTS.register(cls)


def get_loss(name: str) -> LossVariant:
    """A fresh instance of the registered variant `name`; an unknown name lists the registered ones."""
    return LOSS_VARIANTS.lookup(name)()


def valid_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over the valid (mask = 1) entries; 0 when there are none."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)
