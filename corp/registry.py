"""One registry pattern for everything corp looks up by name: methods, tasks, GRPO losses, merge rules.

A `Registry` is a dict from name to entry that is filled once, at import, by `register(name, obj)`
or the `@register` decorator (mergekit's merge-method list and evosax's `Strategies` are the
model), refuses a second entry under one name, and answers an unknown name with one line that
lists the known ones. Tests loop over every registered entry of each registry.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from corp.errors import CorpError

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> entry. `unknown` is the one-line error for a name not registered; it is formatted
    with `name` and `known` (the registered names, comma-separated, in registration order)."""

    def __init__(self, kind: str, unknown: str | None = None):
        super().__init__()
        self.kind = kind
        self.unknown = unknown or f"unknown {kind} '{{name}}'; known: {{known}}"

    def register(self, name: str | T, obj: T | None = None):
        """`register(name, obj)` adds obj and returns it; `@register` on a class with a `name`
        attribute, or `@register("name")`, adds the decorated object."""
        if obj is not None:
            return self._add(name, obj)
        if isinstance(name, str):
            return lambda o: self._add(name, o)
        return self._add(getattr(name, "name", ""), name)

    def _add(self, name: str, obj: T) -> T:
        if not name or name in self:
            raise CorpError(f"{self.kind} {getattr(obj, '__name__', obj)!s:.80} needs a unique name (got '{name}')")
        self[name] = obj
        return obj

    def lookup(self, name: str) -> T:
        """The entry `name`; an unknown name is one CorpError line listing the known ones."""
        if name not in self:
            raise CorpError(self.unknown.format(name=name, known=", ".join(self)))
        return self[name]


__all__ = ["Registry"]
