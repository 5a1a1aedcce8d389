"""The Perturber's pristine copy of the base, without a second copy where the file already holds it."""

from __future__ import annotations

import torch


def pristine_base(params, device, mapped: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Perturber's pristine copy of `params`: a mapped tensor where it holds the same values (the
    page cache of the checkpoint file, no memory: the 1.5B model's 7.1 GB in float32), else a copy."""
    device = torch.device(device)
    base = {}
    for n, p in params:
        m = mapped.get(n)
        same = (
            m is not None
            and m.dtype == p.dtype
            and m.shape == p.shape
            and m.device == device
            and m.data_ptr() != p.data_ptr()  # a second mapping: writing the model must not change it
            and torch.equal(m, p.detach())
        )
        base[n] = m if same else p.detach().to(device, copy=True)
    return base
