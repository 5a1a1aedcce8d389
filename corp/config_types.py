"""What a config field of each type takes, and how an error names the type: `check_types` in
`corp.config` reads a YAML or CLI value through `coerce` (corp.config's docstring, "Types") and
names what it expected with `describe_type`."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin

_SCALARS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def describe_type(tp) -> str:
    """What a field of type `tp` takes, as an error line says it ("an integer or null")."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(describe_type(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin is list or tp is list:
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    return _SCALARS.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(tp) -> str:
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_plural(a) for a in get_args(tp) if a is not type(None))
    return describe_type(tp).removeprefix("an ").removeprefix("a ") + "s"


def coerce(value, tp):
    """`value` as a value of type `tp` (corp.config's docstring, "Types"), or raise TypeError."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, args)
    if origin is list or tp is list:
        return _coerce_list(value, args[0] if args else None)
    coerce = _COERCE.get(origin or tp)  # dict[K, V] by its origin: any mapping, as for a bare dict
    return value if coerce is None else coerce(value)  # a type this checker does not know: validate() is its check


def _coerce_union(value, args: tuple):
    """`X | Y | None`: null where the union allows it, else the first member type that takes the value."""
    if value is None and type(None) in args:
        return None
    for a in args:
        if a is type(None):
            continue
        try:
            return coerce(value, a)
        except TypeError:
            continue
    raise TypeError


def comma_list(value) -> list:
    """A list option's items: a list or tuple as it is; text (a flag, a YAML string: `1,4,16`) split at its
    commas, each item stripped, empty ones dropped. The one place corp splits a comma list."""
    if isinstance(value, (list, tuple)):
        return list(value)
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _coerce_list(value, elem):
    """`list[elem]` (`elem` None: a bare `list`): a list or tuple, one item, or a comma-separated string."""
    if isinstance(value, str):  # a comma-separated list (how flags give one)
        try:
            return [elem(v) if elem in (int, float, str) else v for v in comma_list(value)]
        except ValueError:
            raise TypeError from None
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif elem is not None and not isinstance(value, dict):
        items = [value]  # one item
    else:
        raise TypeError
    return [coerce(v, elem) if elem is not None else v for v in items]


def _as_float(value) -> float:
    """A float field takes a number (not a bool) or a numeric string: YAML 1.1 reads `1e-3` as one."""
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise TypeError from None
    raise TypeError


def _only(ok: Callable[[Any], bool]) -> Callable[[Any], Any]:
    """A coercer that takes a value unchanged where `ok(value)` and refuses any other (no conversion)."""

    def coerce(value):
        if not ok(value):
            raise TypeError
        return value

    return coerce


# how `coerce` takes a value of each plain type it knows (a bool is an int to Python, not to a config)
_COERCE: dict[type, Callable[[Any], Any]] = {
    bool: _only(lambda v: isinstance(v, bool)),
    int: _only(lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: _as_float,
    str: _only(lambda v: isinstance(v, str)),
    dict: _only(lambda v: isinstance(v, dict)),
}
