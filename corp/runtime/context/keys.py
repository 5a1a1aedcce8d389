"""Cache keys: everything that defines one evaluation (`eval_identity`) and its hash (`eval_key`),
and the seeds of a sampled evaluation (`sampling_seeds`, see corp/runtime/context/__init__.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from corp.algorithms.perturb import Direction

SAMPLING = "corp-sample-v1"  # the derivation of sampled evaluations' seeds (module docstring); in their keys


def sampling_seeds(run_seed: int, what: str, ids: Sequence[str]) -> list[int]:
    """The prompt seeds of a sampled evaluation of `what` on examples `ids` (module docstring)."""
    out = []
    for i in ids:
        digest = hashlib.sha256("\x1f".join(("corp-eval-sample", str(int(run_seed)), what, str(i))).encode()).digest()
        out.append(int.from_bytes(digest[:8], "little") >> 1)
    return out


def ids_hash(ids: Sequence[str]) -> str:
    """A hash of an ordered list of example ids (order matters: rows are per-example lists)."""
    return hashlib.sha256("\x1f".join(map(str, ids)).encode()).hexdigest()[:16]


def direction_fingerprint(direction: Direction | None) -> str:
    """'base', or a hash of the direction's seed components (what it is, not how it was found)."""
    if direction is None or direction.is_zero():
        return "base"
    return "dir:" + hashlib.sha256(json.dumps(direction.to_json(), sort_keys=True).encode()).hexdigest()[:16]


def specialist_what(seed: int | None, sigma: float | None) -> str:
    return "base" if seed is None else direction_fingerprint(Direction.single(int(seed), float(sigma)))


def eval_identity(
    context: dict, what: str, ids: Sequence[str], n: int = 1, temperature: float = 0.0, seed: int | None = None
) -> dict:
    """Everything that defines one evaluation (see the module docstring). A sampled one
    (temperature > 0) needs the run's `seed`; a greedy one's key does not hold it, so greedy rows
    are shared between seeds."""
    identity = {
        **context,
        "what": what,
        "ids_hash": ids_hash(ids),
        "n_examples": len(ids),
        "temperature": float(temperature),
        "n": int(n),
    }
    if temperature > 0:
        if seed is None:
            raise ValueError("a sampled evaluation's identity needs the run's seed")
        identity.update(sample_seed=int(seed), sampling=SAMPLING)
    return identity


def eval_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]
