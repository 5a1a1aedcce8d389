"""The noise scheme: what a specialist's seed means (DESIGN.md, "Noise").

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
  from the v2 key of (scheme, seed, name); 1-D tensors get none (`corp.perturb.lowrank_noise`).
- `corp-noise-v1` (before 2026-11): `manual_seed(63-bit blake2b key)`. torch's CPU generator keeps
  only the low 32 bits of a seed, so two (seed, name) pairs shared their noise bit for bit whenever
  those 32 bits matched: about once per 5000 specialists of a 135M model (issue 10). Kept only to
  rebuild old recipes and populations.

Why this departs from the RandOpt public code: that code seeds one generator per specialist and
reuses it for every tensor, so all same-shaped tensors get identical noise.
"""

from __future__ import annotations

import hashlib
import struct
import threading

import numpy as np
import torch

from corp import CorpError
from corp.perturb.lowrank_noise import lowrank_noise, lowrank_rank

SCHEME_VERSION = "corp-noise-v2"  # bump whenever the mapping (seed, name) -> tensor changes
SCHEMES = ("corp-noise-v1", "corp-noise-v2")  # every scheme `noise` can still generate

# torch's CPU generator state (CPUGeneratorImplState, 5056 bytes): uint64 initial seed, int32 left,
# int32 seeded, uint64 next, uint64 state[624] (one 32-bit word each), then cached normals (invalid).
_MT_N = 624
_STATE_BYTES = 5056
_STATE_OFFSET = 24
_layout_checked = False
_scratch = threading.local()  # one state buffer per thread, reused: a fresh one per tensor costs more than the hashes


def check_scheme(scheme: str | None, source: str) -> str:
    """`scheme` if this corp can generate it; else one clear error naming where it came from."""
    if scheme not in SCHEMES and lowrank_rank(scheme, source) is None:
        raise CorpError(f"{source} uses noise scheme '{scheme}', which this corp cannot generate (it knows {', '.join(SCHEMES)}); its seeds would mean other weights: use the corp version that made it")
    return scheme


def noise_key(seed: int, name: str, scheme: str = SCHEME_VERSION) -> int:
    """The generator key of tensor `name` of specialist `seed`: 63 bits under v1 (of which torch used
    32), 128 bits under v2."""
    if scheme == "corp-noise-v1":
        digest = hashlib.blake2b(f"corp-noise-v1|{int(seed)}|{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)
    check_scheme(scheme, "noise_key")
    return int.from_bytes(hashlib.blake2b(f"{scheme}|{int(seed)}|{name}".encode(), digest_size=16).digest(), "little")


def _mt_state(words: np.ndarray, initial_seed: int) -> torch.Tensor:
    """A torch CPU generator state whose Mersenne Twister holds `words` (624 uint32) and twists
    before its first output, as `manual_seed` leaves it."""
    buf = np.zeros(_STATE_BYTES, dtype=np.uint8)
    struct.pack_into("<QiiQ", buf, 0, initial_seed & ((1 << 64) - 1), 1, 1, 0)
    buf[_STATE_OFFSET : _STATE_OFFSET + 8 * _MT_N].view("<u8")[:] = words
    return torch.from_numpy(buf)


def _check_layout() -> None:
    """Once per process: a state written by `_mt_state` must reproduce `manual_seed`'s stream, else
    this torch stores its generator differently and v2 noise would silently change."""
    global _layout_checked
    words = [5489]  # the Mersenne Twister's own seeding of 5489 (init_genrand), as manual_seed does
    for j in range(1, _MT_N):
        words.append((1812433253 * (words[-1] ^ (words[-1] >> 30)) + j) & 0xFFFFFFFF)
    a, b = torch.Generator(device="cpu"), torch.Generator(device="cpu")
    a.manual_seed(5489)
    try:
        b.set_state(_mt_state(np.array(words, dtype=np.uint32), 5489))
        same = torch.equal(torch.randn(64, generator=a), torch.randn(64, generator=b))
    except RuntimeError:
        same = False
    if not same:
        raise CorpError(f"torch {torch.__version__} stores its CPU generator state in a layout noise scheme corp-noise-v2 does not know; use a torch version corp supports (2.x)")
    _layout_checked = True


def _seed_v2(gen: torch.Generator, key: int) -> None:
    if not _layout_checked:
        _check_layout()
    words = np.frombuffer(hashlib.shake_128(key.to_bytes(16, "little")).digest(4 * _MT_N), dtype="<u4")
    state = getattr(_scratch, "state", None)
    if state is None:
        state = _scratch.state = _mt_state(words, key)
    else:  # same layout as _mt_state: only the initial seed and the words change (set_state copies them)
        buf = state.numpy()
        buf[:8].view("<u8")[0] = key & ((1 << 64) - 1)
        buf[_STATE_OFFSET : _STATE_OFFSET + 8 * _MT_N].view("<u8")[:] = words
    gen.set_state(state)


def seed_generator(gen: torch.Generator, key: int, scheme: str = SCHEME_VERSION) -> torch.Generator:
    """Put `gen` in the state that `key` (see `noise_key`) means under `scheme`."""
    if scheme == "corp-noise-v2" or lowrank_rank(scheme) is not None:  # low-rank factors: v2's seeding
        _seed_v2(gen, key)
    elif scheme == "corp-noise-v1":
        gen.manual_seed(key)  # torch keeps the low 32 bits: the v1 defect, kept for old recipes
    else:
        check_scheme(scheme, "seed_generator")
    return gen


def noise(seed: int, name: str, shape: torch.Size | tuple[int, ...], generator: torch.Generator | None = None, out: torch.Tensor | None = None, scheme: str = SCHEME_VERSION) -> torch.Tensor:
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
