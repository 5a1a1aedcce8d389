"""The noise scheme: what a specialist's seed means (DESIGN.md, "Noise").

eps(seed, name) is a standard-normal fp32 tensor drawn from a torch CPU generator seeded with a
stable 63-bit hash of (scheme version, seed, canonical HF tensor name). Every tensor gets
independent noise, one tensor can be regenerated without the others, and the hash never uses
Python's salted `hash()`. Noise is always drawn on the CPU so that a seed means the same weights
on every device and backend; it is moved to the parameter's device afterwards.

Why this departs from the RandOpt public code: that code seeds one generator per specialist and
reuses it for every tensor, so all same-shaped tensors get identical noise.
"""

from __future__ import annotations

import hashlib

import torch

SCHEME_VERSION = "corp-noise-v1"  # bump whenever the mapping (seed, name) -> tensor changes


def noise_key(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{SCHEME_VERSION}|{int(seed)}|{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def noise(seed: int, name: str, shape: torch.Size | tuple[int, ...], generator: torch.Generator | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Standard-normal fp32 noise for tensor `name` of specialist `seed` (CPU).

    `out` (fp32, CPU, of `shape`) is filled in place: reusing one buffer avoids page-faulting a
    fresh allocation per tensor, which costs more than drawing the numbers.
    """
    gen = generator or torch.Generator(device="cpu")
    gen.manual_seed(noise_key(seed, name))
    if out is not None:
        return torch.randn(tuple(shape), generator=gen, out=out)
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)


def specialist_seeds(master_seed: int, n: int) -> list[int]:
    """N distinct specialist seeds derived from a run's master seed.

    Seed i depends only on (master_seed, i), so growing a population keeps its first members.
    """
    seeds: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(seeds) < n:
        digest = hashlib.blake2b(f"corp-specialist|{int(master_seed)}|{i}".encode(), digest_size=4).digest()
        s = int.from_bytes(digest, "little") & 0x7FFFFFFF
        if s not in seen:
            seen.add(s)
            seeds.append(s)
        i += 1
    return seeds
