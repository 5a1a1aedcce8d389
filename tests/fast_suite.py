"""The fast suite (`make test`: pytest -m "not slow") and what it must cover: every module of corp.

The full suite (`make test-all`, CI) runs everything; a test, or a whole test file with
`pytestmark = pytest.mark.slow`, marked `slow` runs only there (docs/testing.md lists them and why).
tests/conftest.py uses this module twice on a fast run: a file marked slow as a whole is not even
imported (its imports would otherwise count as the fast suite's), and at the end of a whole fast run
a module of corp that no fast test imported fails the run, named."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

FAST = "not slow"  # the mark expression of the fast suite (the Makefile's `make test`)


def _is_slow_mark(node: ast.expr) -> bool:
    """`pytest.mark.slow` (or `mark.slow`), as written in a pytestmark."""
    if not (isinstance(node, ast.Attribute) and node.attr == "slow"):
        return False
    return getattr(node.value, "attr", None) == "mark" or getattr(node.value, "id", None) == "mark"


def marked_slow(path: Path) -> bool:
    """Whether a test file is marked slow as a whole: a module-level `pytestmark` that is, or lists, pytest.mark.slow."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return any(_is_slow_mark(m) for m in marks)
    return False


def package_modules(package_dir: Path) -> set[str]:
    """Dotted names of every module under a package directory (a package's __init__.py is the package)."""
    out = set()
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def uncovered(imported: Iterable[str], package_dir: Path) -> list[str]:
    """The package's modules not among the imported names (sys.modules' keys), sorted."""
    return sorted(package_modules(package_dir) - set(imported))
