"""The noise scheme: what a specialist's seed means (docs/architecture.md, "Noise").

eps(seed, name) is a standard-normal fp32 tensor drawn by `torch.randn` from a CPU generator whose
state is a function of a stable hash of (scheme version, seed, canonical HF tensor name). Every
tensor gets independent noise, one tensor can be regenerated without the others, and the hash never
uses Python's salted `hash()`. Noise is always drawn on the CPU so that a seed means the same weights
on every device and backend; it is moved to the parameter's device afterwards.

Schemes (the version is stored in every recipe and population; `noise(..., scheme=)` dispatches on
it, so a run made under an older scheme is rebuilt bit-identically, and an unknown one is refused):

- `corp-noise-v2` (current): the key is the 128-bit blake2b digest of "v2|seed|name"; the Mersenne
  Twister's whole 624-word state is SHAKE-128(key), written into the torch generator with
  `set_state`. Two (seed, name) pairs share noise only if their 128-bit keys collide (birthday bound
  2^64 pairs). Costs about 14 us of CPU per tensor over v1 (the hashes and one 5 KB state copy;
  3.7 ms per SmolLM2-135M specialist), nothing per element: the numbers still come from torch's
  vectorised `randn` (numpy's generators, which would take a 128-bit key directly, draw normals
  about 2x slower; see results/perturb-overhead/).
- `corp-lowrank-v1:r=R`: rank-R noise per weight matrix, E = A B^T / sqrt(R), its factors drawn
  from the v2 key of (scheme, seed, name); 1-D tensors get none (`corp.algorithms.perturb.lowrank_noise`).
- `corp-noise-v1` (before 2026-11): `manual_seed(63-bit blake2b key)`. torch's CPU generator keeps
  only the low 32 bits of a seed, so two (seed, name) pairs shared their noise bit for bit whenever
  those 32 bits matched: about once per 5000 specialists of a 135M model (issue 10). Kept only to
  rebuild old recipes and populations.

Why this departs from the RandOpt public code: that code seeds one generator per specialist and
reuses it for every tensor, so all same-shaped tensors get identical noise.
"""

from __future__ import annotations

import hashlib
import math

import torch

from corp.algorithms.perturb.lowrank_noise import dense as lowrank_dense
from corp.algorithms.perturb.lowrank_noise import factors as lowrank_factors
from corp.algorithms.perturb.lowrank_noise import lowrank_noise, lowrank_rank

# the scheme's public names, re-exported
from corp.algorithms.perturb.seeding import SCHEME_VERSION, SCHEMES, check_scheme, noise_key, seed_generator  # noqa: F401


def noise(
    seed: int,
    name: str,
    shape: torch.Size | tuple[int, ...],
    generator: torch.Generator | None = None,
    out: torch.Tensor | None = None,
    scheme: str = SCHEME_VERSION,
) -> torch.Tensor:
    """Standard-normal fp32 noise for tensor `name` of specialist `seed` (CPU), under `scheme`.

    Under a low-rank scheme: the dense rank-R noise (zeros for a 1-D tensor), same bits on every thread.
    The one function every materialisation path calls (Direction.add_to, the Gram matrix, the
    split-half analysis). `out` (fp32, CPU, of `shape`) is filled in place: reusing one buffer
    avoids page-faulting a fresh allocation per tensor, which costs more than drawing the numbers.
    """
    if scheme not in SCHEMES and lowrank_rank(scheme) is not None:
        return lowrank_noise(seed, name, shape, scheme, generator, out)
    gen = seed_generator(generator or torch.Generator(device="cpu"), noise_key(seed, name, scheme), scheme)
    if out is not None:
        return torch.randn(tuple(shape), generator=gen, out=out)
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)


def derive_seeds(label: str, *parts: int, n: int) -> list[int]:
    """n distinct 31-bit seeds, seed i a stable hash of (label, parts, i): the one seed derivation
    (populations: label "corp-specialist", parts (master seed,); ES: "corp-es", (master seed, iteration)).
    Growing n keeps the first seeds."""
    prefix = "|".join([label, *(str(int(p)) for p in parts)])
    seeds: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(seeds) < n:
        digest = hashlib.blake2b(f"{prefix}|{i}".encode(), digest_size=4).digest()
        s = int.from_bytes(digest, "little") & 0x7FFFFFFF
        if s not in seen:
            seen.add(s)
            seeds.append(s)
        i += 1
    return seeds


def specialist_seeds(master_seed: int, n: int) -> list[int]:
    """N distinct specialist seeds derived from a run's master seed.

    Seed i depends only on (master_seed, i), so growing a population keeps its first members.
    """
    return derive_seeds("corp-specialist", master_seed, n=n)


# torch's CPU randn fills fp32 16 numbers at a time (Box-Muller over pairs 8 apart) and, for a length that is
# not a multiple of 16, draws the last 16 again; under 16 it takes a scalar path. So consecutive calls give the
# numbers of one call only when every piece but the last is a multiple of 16 and the last has at least 16.
_RANDN_GROUP = 16


def piece_bounds(shape, piece: int, scheme: str = SCHEME_VERSION) -> list[tuple[int, int]]:
    """[start, stop) ranges of a tensor's flattened noise, about `piece` elements each, that `NoiseStream`
    draws one after another with the bits of one `noise()` call: under a full-rank scheme multiples of 16
    (`_RANDN_GROUP`) with the last one at least 16 long (it takes the remainder), under a low-rank scheme
    whole rows of the matrix (a 1-D tensor, zeros, in one piece)."""
    n = math.prod(int(d) for d in shape)
    if lowrank_rank(scheme) is not None and scheme not in SCHEMES:
        if len(tuple(shape)) < 2:
            return [(0, n)]
        cols = int(tuple(shape)[1])
        step = max(1, piece // max(cols, 1)) * cols
    else:
        step = max(_RANDN_GROUP, piece // _RANDN_GROUP * _RANDN_GROUP)
    starts = list(range(0, n, step)) or [0]
    if len(starts) > 1 and n - starts[-1] < _RANDN_GROUP:
        starts.pop()  # a remainder under 16 joins the piece before it
    return [(a, b) for a, b in zip(starts, [*starts[1:], n])]


class NoiseStream:
    """The noise of tensor `name` of specialist `seed`, drawn piece by piece (`piece_bounds`, in order): the
    pieces concatenated are `noise(seed, name, shape, scheme=scheme).flatten()`, bit for bit (tested). Each
    stream keeps a generator of its own, so many seeds' streams can advance side by side and a tensor's noise
    is drawn once per seed however it is cut: CoRP's Gram matrix holds a column piece of every elite at a
    time instead of redrawing whole rows for every pair of row blocks."""

    def __init__(self, seed: int, name: str, shape, scheme: str = SCHEME_VERSION):
        self.shape, self.scheme, self._at = tuple(int(d) for d in shape), scheme, 0
        if lowrank_rank(scheme) is not None and scheme not in SCHEMES:
            self._factors = lowrank_factors(seed, name, self.shape, scheme)
            self._gen = None
        else:
            self._factors = None
            self._gen = seed_generator(torch.Generator(device="cpu"), noise_key(seed, name, scheme), scheme)

    def fill(self, out: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Writes the flat noise [start, stop) into `out` (1-D fp32 of stop - start): the next piece."""
        if start != self._at:
            raise ValueError(f"NoiseStream: piece [{start}, {stop}) asked for at {self._at}; pieces come in order")
        if out.dtype != torch.float32 or not out.is_contiguous():  # randn's scalar path would give other bits
            raise ValueError("NoiseStream: out must be contiguous float32")
        self._at = stop
        if self._gen is not None:
            return torch.randn(stop - start, generator=self._gen, out=out)
        if self._factors is None:  # a 1-D tensor under a low-rank scheme: no noise
            return out.zero_()
        A, B = self._factors
        cols = self.shape[1]
        return lowrank_dense(A[start // cols : stop // cols], B, out=out.view(-1, cols)).view(-1)
