"""The size limits docs/development.md sets for corp/, as a test (issue 56): no file over 600 lines, no
function or method over 80 lines (from its `def` line to its last line), no function over McCabe
complexity 10 (ruff's C901 at its default limit, run with --isolated so no project setting moves it).

The figures come from benchmarks/structure_counts.py, which reports them; this test fails on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def limit_violations(root: Path, package: str = "corp") -> tuple[list[str], bool]:
    """(every break of the limits under root/package, one line each; whether complexity was checked:
    False where ruff is not installed)."""
    fig = load("structure_counts").measure(root, package)
    out = [f"{f['file']}: {f['lines']} lines (limit {MAX_FILE_LINES})" for f in fig["files_over_600_lines"]]
    # structure_counts lists functions of 80 lines or more; the limit lets 80 through
    out += [
        f"{f['file']}: {f['function']} is {f['lines']} lines (limit {MAX_FUNCTION_LINES})"
        for f in fig["functions_of_80_lines_or_more"]
        if f["lines"] > MAX_FUNCTION_LINES
    ]
    cx = fig["complexity"]
    out += [
        f"{v['file']}:{v['line']}: {v['function']} has complexity {v['complexity']} (limit 10)"
        for v in cx["violations"]
    ]
    return out, cx["count"] is not None


def _function(name: str, lines: int) -> list[str]:
    """A function of exactly `lines` lines, `def` included."""
    return [f"def {name}():", "    v = 0", *["    v += 1"] * (lines - 3), "    return v"]


def _plant(root: Path) -> None:
    """corp/ with one break of each limit and one case just inside each: a 601-line file and a 600-line
    one, an 81-line method and an 80-line function, a function of complexity 11 and one of 10."""
    pkg = root / "corp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    tangled = ["def tangled(n):", *[f"    if n == {i}:\n        n += 1" for i in range(10)], "    return n"]
    plain = ["def plain(n):", *[f"    if n == {i}:\n        n += 1" for i in range(9)], "    return n"]
    body = ["class Long:", *("    " + line for line in _function("method", 81)), "", *_function("ok", 80), ""]
    body += ["\n".join(tangled), "", "\n".join(plain)]
    body = "\n".join(body).splitlines()
    (pkg / "long.py").write_text("\n".join(body + ["X = 1"] * (601 - len(body))) + "\n")
    (pkg / "fits.py").write_text("\n".join(["X = 1"] * 600) + "\n")


def test_the_checker_finds_each_planted_break_and_nothing_just_inside(tmp_path):
    _plant(tmp_path)
    found, checked_complexity = limit_violations(tmp_path)
    expected = [
        "corp/long.py: 601 lines (limit 600)",
        "corp/long.py: Long.method is 81 lines (limit 80)",
    ]
    if checked_complexity:
        expected.append("corp/long.py:165: tangled has complexity 11 (limit 10)")
    assert found == expected


def test_corp_keeps_its_size_and_complexity_limits():
    found, checked_complexity = limit_violations(ROOT)
    assert not found, "over the limits (split by job; docs/development.md):\n" + "\n".join(found)
    if not checked_complexity:
        pytest.skip("ruff not installed: file and function lengths checked, complexity not")
