"""The method registry: every method corp runs, by name, registered once.

A method is one module or package under corp/methods/ that exports `METHOD`, a `corp.method.Method`
carrying everything about it (config, run function, help line, smoke options, terminal summary and
bench adapter). Adding a method is that module plus one line in METHODS below (docs/development.md
walks through an example). The CLI makes one `corp NAME` command per entry, in this order; `corp
bench` runs the entries that have a bench adapter; tests/test_methods.py runs every entry on a tiny
random model. Method modules never import one another: what two methods share is in the core
(tests/test_layers.py).
"""

from __future__ import annotations

from corp.method import Method
from corp.methods import (
    analyze_rank,
    consolidate,
    es,
    fedcorp,
    fera,
    fgrpo,
    ftis,
    grpo,
    randopt,
    score,
    self_consistency,
)
from corp.methods import eval as eval_method
from corp.registry import Registry

METHODS: tuple[Method, ...] = (
    score.METHOD,
    randopt.METHOD,
    consolidate.METHOD,
    es.METHOD,
    grpo.METHOD,
    eval_method.METHOD,
    self_consistency.METHOD,
    fedcorp.METHOD,
    fgrpo.METHOD,
    analyze_rank.METHOD,
    ftis.METHOD,
    fera.METHOD,
)

REGISTRY: Registry[Method] = Registry("method")
for _m in METHODS:
    REGISTRY.register(_m)  # a second method under one name is an error at import


def get_method(name: str) -> Method:
    """The registered method `name`; an unknown name is one line listing the known ones."""
    return REGISTRY.lookup(name)


def methods() -> tuple[Method, ...]:
    return METHODS


__all__ = ["METHODS", "REGISTRY", "Method", "get_method", "methods"]
