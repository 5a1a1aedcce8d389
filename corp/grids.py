"""Searched grids: whether a value a search chose sits on the edge of its grid (issue 55).

A value chosen at the smallest or largest point of what was searched says the best may lie outside
the grid: corp's reports and model cards flag it (`edge_flags` in report.json, a line in the printed
report and the card) rather than present the choice as settled. Every site that picks from a grid
uses `edge` here: CoRP's step search (alpha, q, beta), RandOpt's top-1 noise scale against the
population's sigmas, and the bench's tuning search.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# flags for values a caller chose, by its own search before the run, for the runs it starts inside
# `chosen_outside` (corp bench's tuning): a run cannot see that search, so the caller says it here
_OUTSIDE: ContextVar[tuple[dict, ...]] = ContextVar("corp_grid_choices_outside", default=())


def _number(value: Any) -> float | None:
    """A grid point as a number: a number, or a one-value list of one (the bench searches `quantiles: [[0.5],
    [0.75]]`); None for anything else (a list of several values, a string, a bool)."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def edge(chosen: Any, grid: Sequence[Any]) -> str | None:
    """'min' or 'max' when `chosen` is the smallest or largest value of a grid of more than one distinct
    value; None when it lies inside, the grid has one value, or its points are not numbers."""
    points = [_number(v) for v in grid]
    value = _number(chosen)
    if value is None or any(p is None for p in points) or len(set(points)) < 2:
        return None
    if value <= min(points):
        return "min"
    if value >= max(points):
        return "max"
    return None


def edge_flag(name: str, chosen: Any, grid: Sequence[Any], option: str | None = None) -> dict | None:
    """report.json's flag for a choice on its grid's edge, e.g. {"name": "alpha", "chosen": 8, "grid": [1, 2, 4, 8],
    "edge": "max", "option": "--alphas"}; None when it is not on an edge. `option`: the flag that sets the grid."""
    side = edge(chosen, grid)
    if side is None:
        return None
    flag = {"name": name, "chosen": chosen, "grid": list(grid), "edge": side}
    return {**flag, "option": option} if option else flag


@contextmanager
def chosen_outside(flags: Sequence[dict]) -> Iterator[None]:
    """Runs started inside this block carry `flags` (`edge_flag`s with "by": who chose, e.g. corp bench's
    search) in their report.json's `edge_flags`, so their printed report and model card name the edge;
    `chosen_outside(())` shields a run started inside that is not the choice's (a shared population)."""
    token = _OUTSIDE.set(tuple(flags))
    try:
        yield
    finally:
        _OUTSIDE.reset(token)


def outside_flags() -> list[dict]:
    """The flags `chosen_outside` set for the runs started now ([] outside any such block)."""
    return list(_OUTSIDE.get())


def _shown(value: Any) -> str:
    number = _number(value)
    return f"{number:g}" if number is not None else str(value)


def edge_line(flag: dict) -> str:
    """One line of a flag: 'alpha = 8 is the largest value searched (1, 2, 4, 8); a larger one may be better:
    pass --alphas with a larger value'."""
    most, more = ("largest", "larger") if flag["edge"] == "max" else ("smallest", "smaller")
    where = f"pass {flag['option']} with a {more} value" if flag.get("option") else f"add a {more} value to its grid"
    points = flag["grid"]
    if all(_number(v) is not None for v in points):  # in order, whatever order the grid was given in
        points = sorted(points, key=_number)
    grid = ", ".join(_shown(v) for v in points)
    by = f" by {flag['by']}" if flag.get("by") else ""
    return (
        f"{flag['name']} = {_shown(flag['chosen'])} is the {most} value searched{by} ({grid}); "
        f"a {more} one may be better: {where}"
    )


def edge_lines(flags: Sequence[dict] | None) -> list[str]:
    """One line per flag (none for none)."""
    return [edge_line(f) for f in flags or ()]
