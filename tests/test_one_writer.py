"""One writer (issue 56): the driver opens every run and ends it. A method returns what it made
(`corp.runtime.loop.Outputs`: rows, report fields, recipe, model) and `corp.runtime.loop.drive` / `finish` write it;
no module under corp/methods/ writes a run's outputs (report, recipe and its factors, saved model)
itself. Checked from the source (parsed with ast, nothing imported), like tests/test_layers.py."""

from __future__ import annotations

import ast
from pathlib import Path

CORP = Path(__file__).resolve().parents[1] / "corp"

# what writes a run's outputs: only the driver (corp/runtime/loop.py) and the run layer call these
WRITERS = {"write_report", "write_recipe", "save_model", "write_factors"}

# methods that still write their report themselves, each with why (shrink this; never grow it)
NOT_YET = {
    "score.py": "its report is written by the method (being edited beside issue 56's noise scales)",
}


def own_writes(source: str) -> list[str]:
    """The run-output writers a module's source imports or calls, by name (one entry per use)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [a.name for a in node.names if a.name in WRITERS]
        elif isinstance(node, ast.Attribute) and node.attr in WRITERS:
            found.append(node.attr)  # corp.runtime.runs.write_report(...) without importing the name
    return found


def method_files() -> dict[str, Path]:
    root = CORP / "methods"
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*.py"))}


def test_no_method_writes_a_runs_outputs_itself():
    offenders = {
        rel: sorted(set(found))
        for rel, path in method_files().items()
        if rel not in NOT_YET and (found := own_writes(path.read_text()))
    }
    assert not offenders, (
        f"methods write run outputs themselves (return them in corp.runtime.loop.Outputs): {offenders}"
    )


def test_the_list_of_methods_not_yet_converted_is_current():
    """Each entry of NOT_YET still writes (a converted method leaves the list), and exists."""
    files = method_files()
    stale = [rel for rel in NOT_YET if rel not in files or not own_writes(files[rel].read_text())]
    assert not stale, f"remove from NOT_YET (they no longer write run outputs): {stale}"


def test_a_planted_method_that_writes_its_report_is_caught():
    planted = """
from corp.runtime.context import open_run
from corp.runtime.runs import write_report
import corp.algorithms.recipe

def run(cfg):
    with open_run(cfg, "planted") as ctx:
        corp.algorithms.recipe.write_recipe(ctx.run_dir / "recipe.json", {})
        return write_report(ctx.run_dir, "planted", cfg.model, cfg.task, [])
"""
    assert sorted(own_writes(planted)) == ["write_recipe", "write_report"]
    converted = """
from corp.runtime.loop import Outputs, drive

def run(cfg, backend=None):
    return drive(cfg, "planted", backend, lambda ctx: Outputs([], [], None, {"n": 1}))
"""
    assert own_writes(converted) == []


def test_consolidate_and_randopt_end_through_the_driver():
    """The two methods issue 56 named: they open their run with `drive`, never `open_run`."""
    for rel in ("consolidate/run.py", "randopt.py", "self_consistency.py"):
        tree = ast.parse(method_files()[rel].read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "drive" in names and "open_run" not in names, rel
