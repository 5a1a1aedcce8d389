"""One writer (issue 56): the driver opens every run and ends it. A method returns what it made
(`corp.runtime.loop.Outputs`: rows, report fields, recipe, model) and `corp.runtime.loop.drive` opens the
run, calls it and writes the outputs with `finish`; no method's module opens a run (`open_run`) or writes
a run's outputs (report, recipe and its factors, saved model) itself. Checked from the source (parsed
with ast), like tests/test_layers.py: every module under corp/methods/ and the module of each registered
method's run function (eval's is corp/evaluate/passk.py)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

CORP = Path(__file__).resolve().parents[1] / "corp"

# what writes a run's outputs: only the driver (corp/runtime/loop.py) and the run layer call these
WRITERS = {"write_report", "write_recipe", "save_model", "write_factors"}
# what opens a run: only `drive` (a method that opens its own run ends it itself, and writes what it likes)
OPENERS = {"open_run", "setup_run"}


def own_writes(source: str) -> list[str]:
    """The run openers and output writers a module's source imports or calls, by name (one entry per use)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [a.name for a in node.names if a.name in WRITERS | OPENERS]
        elif isinstance(node, ast.Attribute) and node.attr in WRITERS | OPENERS:
            found.append(node.attr)  # corp.runtime.runs.write_report(...) without importing the name
    return found


def run_functions() -> dict[str, object]:
    """Each registered method's run function, by the method's name."""
    from corp.methods import METHODS

    return {m.name: m.run for m in METHODS}


def method_files() -> dict[str, Path]:
    """Every module under corp/methods/ and each registered method's run module, by path under corp/."""
    files = {p.relative_to(CORP).as_posix(): p for p in sorted((CORP / "methods").rglob("*.py"))}
    for run in run_functions().values():
        path = Path(inspect.getsourcefile(run)).resolve()
        files[path.relative_to(CORP).as_posix()] = path
    return files


def test_no_method_opens_a_run_or_writes_its_outputs_itself():
    offenders = {
        rel: sorted(set(found)) for rel, path in method_files().items() if (found := own_writes(path.read_text()))
    }
    assert not offenders, (
        f"methods open runs or write run outputs themselves (return an Outputs to corp.runtime.loop.drive): {offenders}"
    )


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
    assert sorted(own_writes(planted)) == ["open_run", "write_recipe", "write_report"]
    converted = """
from corp.runtime.loop import Outputs, drive

def run(cfg, backend=None):
    return drive(cfg, "planted", backend, lambda ctx: Outputs([], [], None, {"n": 1}))
"""
    assert own_writes(converted) == []


def calls_drive(source: str, function: str) -> bool:
    """Whether `function` in `source` calls `drive` (by name or as an attribute)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return any(
                isinstance(c, ast.Call) and getattr(c.func, "id", getattr(c.func, "attr", None)) == "drive"
                for c in ast.walk(node)
            )
    return False


def test_every_registered_method_runs_through_the_driver():
    """Each registered method's run function calls `drive` (analyze-rank too: its runs go through it; only
    its in-place analysis of an existing run directory, which opens no run, does not)."""
    files = method_files()
    missing = []
    for name, run in run_functions().items():
        rel = Path(inspect.getsourcefile(run)).resolve().relative_to(CORP).as_posix()
        if not calls_drive(files[rel].read_text(), run.__name__):
            missing.append(f"{name} ({rel}: {run.__name__})")
    assert not missing, f"methods that do not run through corp.runtime.loop.drive: {missing}"


def test_a_method_that_opens_its_own_run_is_caught():
    planted = """
from corp.runtime.context import open_run
from corp.runtime.loop import Outputs, finish

def run_planted(cfg, backend=None):
    with open_run(cfg, "planted", backend) as ctx:
        return finish(ctx, Outputs([], [], None))
"""
    assert own_writes(planted) == ["open_run"]
    assert not calls_drive(planted, "run_planted")
    assert calls_drive("def run(cfg):\n    return loop.drive(cfg, 'x', None, work)\n", "run")
