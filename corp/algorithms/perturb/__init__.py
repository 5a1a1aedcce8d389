"""Seeded Gaussian perturbations: the noise scheme, directions, exact apply/restore."""

from corp.algorithms.perturb.direction import (
    Component,
    Direction,
    ParamFilter,
    Perturber,
    selected_parameters,
    weights_hash,
)
from corp.algorithms.perturb.lowrank_noise import lowrank_rank, scheme_from_flag
from corp.algorithms.perturb.noise import SCHEME_VERSION, SCHEMES, check_scheme, noise, noise_key, specialist_seeds

__all__ = [
    "Component",
    "Direction",
    "ParamFilter",
    "Perturber",
    "selected_parameters",
    "weights_hash",
    "lowrank_rank",
    "scheme_from_flag",
    "SCHEME_VERSION",
    "SCHEMES",
    "check_scheme",
    "noise",
    "noise_key",
    "specialist_seeds",
]
