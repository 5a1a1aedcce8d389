"""Seeded Gaussian perturbations: the noise scheme, directions, exact apply/restore."""

from corp.perturb.direction import Component, Direction, ParamFilter, Perturber, selected_parameters, weights_hash
from corp.perturb.noise import SCHEME_VERSION, SCHEMES, check_scheme, noise, noise_key, specialist_seeds

__all__ = [
    "Component", "Direction", "ParamFilter", "Perturber", "selected_parameters", "weights_hash",
    "SCHEME_VERSION", "SCHEMES", "check_scheme", "noise", "noise_key", "specialist_seeds",
]
