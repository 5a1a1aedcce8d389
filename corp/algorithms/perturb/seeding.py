"""Seeding of the noise generators: the (scheme, seed, name) key and the generator state it fixes.

The primitives `corp.algorithms.perturb.noise` (full-rank noise) and `corp.algorithms.perturb.lowrank_noise` (the low-rank
factors) both draw from; kept apart from both so that neither imports the other's module at
import time (see `corp.algorithms.perturb.noise` for the schemes and why v2 fills the whole state).
"""

from __future__ import annotations

import hashlib
import re
import struct
import threading

import numpy as np
import torch

from corp.errors import CorpError

SCHEME_VERSION = "corp-noise-v2"  # bump whenever the mapping (seed, name) -> tensor changes
SCHEMES = ("corp-noise-v1", "corp-noise-v2")  # every scheme `noise` can still generate

# torch's CPU generator state (CPUGeneratorImplState, 5056 bytes): uint64 initial seed, int32 left,
# int32 seeded, uint64 next, uint64 state[624] (one 32-bit word each), then cached normals (invalid).
_MT_N = 624
_STATE_BYTES = 5056
_STATE_OFFSET = 24
_layout_checked = False
_scratch = threading.local()  # one state buffer per thread, reused: a fresh one per tensor costs more than the hashes


LOWRANK_VERSION = "corp-lowrank-v1"
_SCHEME = re.compile(r"^corp-lowrank-v(\d+):r=(.*)$")


def lowrank_scheme(rank: int) -> str:
    return f"{LOWRANK_VERSION}:r={int(rank)}"


_CANONICAL_RANK = re.compile(r"[1-9][0-9]*")  # ASCII digits, no sign, leading zero, underscore or space


def parse_rank(text: str, source: str) -> int:
    """A rank written canonically: `int()` would also take `1_0`, `02`, `+4` and ` 4`, and the
    scheme string (a cache key, the recipe's) would then name one rank several ways."""
    if _CANONICAL_RANK.fullmatch(text):
        return int(text)
    if re.fullmatch(r"-?[0-9]+", text) and int(text) <= 0:
        raise CorpError(f"{source}: low-rank noise rank must be >= 1, got r={text}")
    raise CorpError(
        f"{source}: low-rank noise rank 'r={text}' is not an integer written plainly (decimal digits, no sign, "
        "leading zero or underscore); use e.g. lowrank:r=4"
    )


def lowrank_rank(scheme: str | None, source: str = "noise scheme") -> int | None:
    """The rank R of a low-rank scheme string, None for any other scheme; a low-rank scheme of an
    unknown version or with a bad rank is one CorpError line naming `source`."""
    m = _SCHEME.match(str(scheme)) if scheme is not None else None
    if m is None:
        return None
    if f"corp-lowrank-v{m.group(1)}" != LOWRANK_VERSION:
        raise CorpError(
            f"{source} uses noise scheme '{scheme}', which this corp cannot generate "
            f"(it knows {LOWRANK_VERSION}:r=R); use the corp version that made it"
        )
    return parse_rank(m.group(2), source)


def check_scheme(scheme: str | None, source: str) -> str:
    """`scheme` if this corp can generate it; else one clear error naming where it came from."""
    if scheme not in SCHEMES and lowrank_rank(scheme, source) is None:
        raise CorpError(
            f"{source} uses noise scheme '{scheme}', which this corp cannot generate (it knows {', '.join(SCHEMES)}); "
            "its seeds would mean other weights: use the corp version that made it"
        )
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
        raise CorpError(
            f"torch {torch.__version__} stores its CPU generator state in a layout noise scheme corp-noise-v2 does not "
            "know; use a torch version corp supports (2.x)"
        )
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
