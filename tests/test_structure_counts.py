"""benchmarks/structure_counts.py counts what it says, on a tiny package built here: corp.a -> corp.b -> corp.c,
one 700-line file holding one 90-line function and one too-complex function, one corp import in a function."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmark_scripts import load


def _structure_counts():
    return load("structure_counts")


def _fake_package(root: Path) -> None:
    """corp/{a,b,c}: a imports b at module level, b imports c (and json) inside a function, c/big.py is
    700 lines: a relative import of its own package, a 90-line function, a function of complexity 12."""
    pkg = root / "corp"
    for sub in ("a", "b", "c"):
        (pkg / sub).mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""fake corp."""\n')
    (pkg / "a" / "__init__.py").write_text("import os\n\nfrom corp.b import x\n\nZ = (os, x)\n")
    (pkg / "b" / "__init__.py").write_text(
        "x = 1\n\n\ndef f():\n    import json\n\n    from corp.c import y\n\n    return json, y\n"
    )
    (pkg / "c" / "__init__.py").write_text("y = 2\n")
    long_one = ["def long_one():", "    v = 0", *["    v += 1"] * 87, "    return v"]  # 90 lines
    tangled = ["def tangled(n):", *[f"    if n == {i}:\n        n += 1" for i in range(11)], "    return n"]
    lines = ["from . import y", "", "", *long_one, "", "", *"\n".join(tangled).splitlines(), ""]
    lines += [f"X{i} = y" for i in range(700 - len(lines))]
    (pkg / "c" / "big.py").write_text("\n".join(lines) + "\n")


def test_every_figure_on_a_tiny_package(tmp_path):
    sc = _structure_counts()
    _fake_package(tmp_path)
    fig = sc.measure(tmp_path)

    assert fig["modules"] == 5
    assert fig["package_arrows"] == 2  # a -> b, b -> c; big.py's import of its own package is a self-edge
    assert fig["module_arrows"] == 3  # corp.a -> corp.b, corp.b -> corp.c, corp.c.big -> corp.c
    assert fig["arrows"] == {"corp": [], "corp.a": ["corp.b"], "corp.b": ["corp.c"], "corp.c": []}
    assert fig["floors"] == 3
    assert fig["longest_chain"] == [["corp.a"], ["corp.b"], ["corp.c"]]
    assert fig["cycles"] == []
    assert fig["files_over_600_lines"] == [{"file": "corp/c/big.py", "lines": 700}]
    assert fig["functions_of_80_lines_or_more"] == [{"function": "long_one", "file": "corp/c/big.py", "lines": 90}]
    # import os, from corp.b, import json (in f), from corp.c (in f), from . import y
    assert {k: fig["imports"][k] for k in ("total", "inside_functions", "inside_functions_own")} == {
        "total": 5,
        "inside_functions": 2,
        "inside_functions_own": 1,
    }
    cx = fig["complexity"]
    if sc._ruff() is None:
        assert cx["count"] is None
    else:
        assert cx["count"] == 1
        assert cx["violations"][0] | {"line": None} == {
            "function": "tangled",
            "complexity": 12,
            "file": "corp/c/big.py",
            "line": None,
        }


def test_a_cycle_is_listed_and_counted_as_one_floor(tmp_path, capsys):
    sc = _structure_counts()
    _fake_package(tmp_path)
    # c now imports a: a -> b -> c -> a is one strongly connected component, one floor
    (tmp_path / "corp" / "c" / "__init__.py").write_text("from corp.a import Z\n\ny = 2\n")
    fig = sc.main(["--root", str(tmp_path), "--json", str(tmp_path / "out" / "fig.json")])

    assert fig["package_arrows"] == 3
    assert fig["floors"] == 1
    assert fig["cycles"] == [["corp.a", "corp.b", "corp.c"]]
    assert json.loads((tmp_path / "out" / "fig.json").read_text()) == fig
    report = capsys.readouterr().out
    assert "corp.a <-> corp.b <-> corp.c" in report and "**3**" in report
    assert fig["back_arrows"] == [["corp.c", "corp.a"]]  # the walk goes a -> b -> c, and c points back up
    assert fig["module_cycles"] == [["corp.a", "corp.b", "corp.c"]]
    assert fig["module_back_arrows"] == [["corp.c", "corp.a"]]
    assert "back-arrows (package graph): **1**" in report and "module graph: **1** cycle(s)" in report


def test_an_import_by_name_is_an_arrow(tmp_path):
    """The circle issue 56 found: corp/__init__.py loads corp.api by name (importlib.import_module), and a
    module below imports the package: a cycle the import statements alone do not show."""
    sc = _structure_counts()
    _fake_package(tmp_path)
    init = "import importlib\n\n\ndef __getattr__(name):\n    return importlib.import_module('corp.a')\n"
    (tmp_path / "corp" / "__init__.py").write_text(init)
    (tmp_path / "corp" / "c" / "__init__.py").write_text("from corp import thing\n\ny = 2\n")
    fig = sc.measure(tmp_path)

    assert fig["arrows"]["corp"] == ["corp.a"]
    assert fig["cycles"] == [["corp", "corp.a", "corp.b", "corp.c"]]
    assert fig["module_cycles"] == [["corp", "corp.a", "corp.b", "corp.c"]]
    assert len(fig["back_arrows"]) == 1
    assert fig["imports"]["inside_functions_own"] == 2  # the import by name sits in a function too


def test_a_grouping_folder_s_entries_are_packages(tmp_path):
    """corp/runtime/ groups packages: corp.runtime.x and corp.runtime.y are two packages, so an arrow between
    them counts, and y importing corp.b while b imports x is no cycle."""
    sc = _structure_counts()
    _fake_package(tmp_path)
    (tmp_path / "corp" / "runtime").mkdir()
    (tmp_path / "corp" / "runtime" / "__init__.py").write_text('"""a folder of packages."""\n')
    (tmp_path / "corp" / "runtime" / "x.py").write_text("X = 1\n")
    (tmp_path / "corp" / "runtime" / "y.py").write_text("from corp.b import x\n")
    (tmp_path / "corp" / "b" / "__init__.py").write_text("from corp.runtime.x import X\n\nx = X\n")
    fig = sc.measure(tmp_path)

    assert fig["arrows"]["corp.runtime.y"] == ["corp.b"]
    assert fig["arrows"]["corp.b"] == ["corp.runtime.x"]
    assert fig["cycles"] == [] and fig["back_arrows"] == [] and fig["module_cycles"] == []
