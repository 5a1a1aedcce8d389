"""The shape of corp's code, in figures a restructuring can be judged by (issue 38, before and after).

What it measures, over every .py file under corp/ (parsed with `ast`; nothing of corp is imported):
  1. import arrows: distinct (importing package -> imported package) edges between corp's top-level
     subpackages and modules (`corp.evaluate`, `corp.bench`, `corp.runtime.models`, ...; `corp/__init__.py` is
     package "", shown as `corp`), self-edges left out. Every import statement counts, also one inside a
     function or under `if TYPE_CHECKING:` (a lazy import is still a dependency). The distinct
     module -> module arrows are counted too, for reference.
  2. floors: the number of packages on the longest path of the package graph (a -> b -> c is 3 floors).
     Where the graph has cycles they are listed, and the floors are counted on its condensation
     (each strongly connected component is one floor).
  3. files over 600 lines, longest first.
  4. functions and methods of 80 lines or more (from the `def` line to the last line of the body),
     longest first.
  5. complexity: the number of ruff C901 violations at ruff's default limit (max-complexity 10; ruff
     runs with --isolated so that no project setting moves the limit). Said so, not failed, without ruff.
  6. imports inside functions: import statements in all, how many sit in a function body, and how many
     of those import corp's own modules.

`from corp.x import y` is an arrow to module corp.x.y when that is a module, else to corp.x (the rule
tests/test_layers.py reads imports by). Relative imports are resolved against the importing module.

    python benchmarks/structure_counts.py                       # markdown report of this repository
    python benchmarks/structure_counts.py --root DIR --json results/structure/before.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

LONG_FILE = 600  # lines; a file over this many is listed
LONG_FUNCTION = 80  # lines; a function this long or longer is listed
# corp's folders that group packages by what they are (their __init__.py is a docstring): each entry in
# one is a package of its own here, as in tests/test_layers.py, which gives each its floor
GROUPS = ("runtime", "algorithms", "evaluate")


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package directory (an __init__.py is its package)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def package_of(module: str) -> str:
    """The top-level subpackage or module a dotted name lies in ("" for the package itself); in a GROUPS
    folder, the entry of that folder (corp.runtime.backends.hf -> "runtime.backends")."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in GROUPS:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else ""


def _import_target(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a `from ... import` names; relative levels count up from the importing package."""
    if not node.level:
        return node.module or ""
    # a package's __init__ is its own package; a plain module's package is its parent
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, files: dict) -> list[str]:
    """The modules one import statement names (all of them, corp's or not)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    target = _import_target(node, module, is_package)
    # `from corp.x import y`: y is a module when corp/x/y.py exists, else a name of corp.x
    submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in files]
    names_left = len(submodules) < len(node.names)
    return submodules + ([target] if names_left else [])


class _Walker(ast.NodeVisitor):
    """One pass over a module: its import statements (with whether each sits in a function) and its functions."""

    def __init__(self) -> None:
        self.imports: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
        self.functions: list[tuple[str, int, int]] = []  # (qualified name, def line, last line)
        self._scope: list[str] = []  # enclosing class and function names, for qualified names
        self._in_function = 0

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.imports.append((node, self._in_function > 0))

    visit_Import = visit_ImportFrom = _import

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("corp.x") with a literal name: an import by name, counted as `import corp.x`
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        first = node.args[0] if node.args else None
        if name == "import_module" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            self._import(ast.copy_location(ast.Import(names=[ast.alias(name=first.value)]), node))
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # node.lineno is the `def` line (decorators sit above it); the name follows Python's __qualname__
        self.functions.append((".".join([*self._scope, node.name]), node.lineno, node.end_lineno))
        self._scope += [node.name, "<locals>"]
        self._in_function += 1
        self.generic_visit(node)
        self._in_function -= 1
        del self._scope[-2:]

    visit_FunctionDef = visit_AsyncFunctionDef = _function


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of a graph (Tarjan), each sorted; every node is in one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def floors(graph: dict[str, set[str]]) -> tuple[int, list[list[str]], list[list[str]]]:
    """(floors, one longest chain of components, the cycles) of a graph whose nodes are all its keys.
    The chain runs from the importer down to what it imports; a cycle is one component (one floor)."""
    components = strongly_connected(graph)
    where = {v: i for i, comp in enumerate(components) for v in comp}
    below = {i: {where[w] for v in comp for w in graph[v]} - {i} for i, comp in enumerate(components)}
    # Tarjan emits a component only after every component it reaches, so one pass in that order is enough
    chain: dict[int, list[int]] = {}
    for i in range(len(components)):
        longest = max((chain[j] for j in below[i]), key=len, default=[])
        chain[i] = [i, *longest]
    top = max(chain.values(), key=len, default=[])
    cycles = [comp for comp in components if len(comp) > 1]
    return len(top), [components[i] for i in top], cycles


def back_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The arrows a depth-first walk of the graph (nodes and arrows in name order) finds pointing to a node
    still on its path: removing them leaves no cycle, and there are none exactly when the graph has none."""
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    found: list[tuple[str, str]] = []

    def visit(v: str) -> None:
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                found.append((v, w))
            elif w not in state:
                visit(w)
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v)
    return found


def _ruff() -> str | None:
    """The ruff beside this Python (a virtual environment's), else the one on PATH."""
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.exists() else shutil.which("ruff")


def complexity(root: Path, package: str) -> dict:
    """ruff's C901 violations over the package at the default max-complexity (10), worst first."""
    ruff = _ruff()
    if ruff is None:
        return {"ruff": None, "count": None, "violations": []}
    cmd = [ruff, "check", "--isolated", "--select", "C901", "--output-format", "json", "--exit-zero", package]
    found = json.loads(subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True).stdout or "[]")
    violations = []
    for v in found:
        # the message reads "`name` is too complex (12 > 10)"
        m = re.search(r"`(.+)` is too complex \((\d+) > (\d+)\)", v["message"])
        violations.append(
            {
                "function": m.group(1) if m else v["message"],
                "complexity": int(m.group(2)) if m else None,
                "file": Path(v["filename"]).resolve().relative_to(root.resolve()).as_posix(),
                "line": v["location"]["row"],
            }
        )
    violations.sort(key=lambda v: (-(v["complexity"] or 0), v["file"], v["line"]))
    version = subprocess.run([ruff, "--version"], capture_output=True, text=True).stdout.strip()
    return {"ruff": version, "count": len(violations), "violations": violations}


def _commit(root: Path, package: str) -> str | None:
    """The repository's commit (short hash, `+dirty` when the package has uncommitted changes), None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", package], cwd=root, capture_output=True, text=True)
    except OSError:
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _import_figures(files: dict[str, Path], walkers: dict[str, _Walker], package: str) -> tuple[set, dict]:
    """(module arrows between the package's modules, the import statement counts)."""
    arrows: set[tuple[str, str]] = set()
    imports = {"total": 0, "inside_functions": 0, "inside_functions_own": 0}
    for module, walker in walkers.items():
        for node, in_function in walker.imports:
            targets = _targets(node, module, files[module].name == "__init__.py", files)
            own = [t for t in targets if t.split(".")[0] == package]
            imports["total"] += 1
            imports["inside_functions"] += in_function
            imports["inside_functions_own"] += in_function and bool(own)
            # a module importing its own name (`from . import x` in a package's __init__) is no arrow
            arrows |= {(module, t) for t in own if t != module}
    imports["inside_functions_share"] = round(imports["inside_functions"] / max(imports["total"], 1), 3)
    return arrows, imports


def _length_figures(files: dict[str, Path], walkers: dict[str, _Walker], root: Path) -> tuple[list, list]:
    """(files over LONG_FILE lines, functions of LONG_FUNCTION lines or more), longest first."""
    long_files, long_functions = [], []
    for module, path in files.items():
        rel = path.relative_to(root).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > LONG_FILE:
            long_files.append({"file": rel, "lines": lines})
        for name, first, last in walkers[module].functions:
            if last - first + 1 >= LONG_FUNCTION:
                long_functions.append({"function": name, "file": rel, "lines": last - first + 1})
    long_files.sort(key=lambda f: (-f["lines"], f["file"]))
    long_functions.sort(key=lambda f: (-f["lines"], f["file"], f["function"]))
    return long_files, long_functions


def measure(root: Path, package: str = "corp") -> dict:
    """Every figure of the module docstring, for the package directory root/package."""
    files = module_files(root / package)
    walkers = {}
    for module, path in files.items():
        walkers[module] = _Walker()
        walkers[module].visit(ast.parse(path.read_text(), str(path)))
    module_arrows, imports = _import_figures(files, walkers, package)

    def show(p: str) -> str:
        return f"{package}.{p}" if p else package

    # every top-level package is a node, also one that imports nothing and is imported by nothing
    graph: dict[str, set[str]] = {show(package_of(m)): set() for m in files}
    for a, b in module_arrows:
        if package_of(a) != package_of(b):  # a package's modules importing each other: no arrow between two
            graph[show(package_of(a))].add(show(package_of(b)))
            graph.setdefault(show(package_of(b)), set())  # a name with no file (a typo, a removed module)
    n_floors, chain, cycles = floors(graph)
    modules: dict[str, set[str]] = {m: set() for m in files}
    for a, b in module_arrows:
        modules[a].add(b)
        modules.setdefault(b, set())
    module_cycles = [c for c in strongly_connected(modules) if len(c) > 1]
    long_files, long_functions = _length_figures(files, walkers, root)
    return {
        "commit": _commit(root, package),
        "package": package,
        "modules": len(files),
        "packages": sorted(graph),
        "package_arrows": sum(len(b) for b in graph.values()),
        "module_arrows": len(module_arrows),
        "arrows": {a: sorted(graph[a]) for a in sorted(graph)},
        "floors": n_floors,
        "longest_chain": chain,
        "cycles": cycles,
        "back_arrows": [list(a) for a in back_arrows(graph)],
        "module_cycles": module_cycles,
        "module_back_arrows": [list(a) for a in back_arrows(modules)],
        "files_over_600_lines": long_files,
        "functions_of_80_lines_or_more": long_functions,
        "complexity": complexity(root, package),
        "imports": imports,
    }


def markdown(fig: dict) -> str:
    """The figures as a markdown report (the JSON holds the same figures)."""
    commit = fig["commit"] or "not a git checkout"
    chain = " -> ".join("{" + ", ".join(c) + "}" if len(c) > 1 else c[0] for c in fig["longest_chain"])
    imp = fig["imports"]
    out = [
        f"# Structure of `{fig['package']}` at {commit}",
        "",
        f"{fig['modules']} modules in {len(fig['packages'])} top-level packages and modules.",
        "",
        "## Import arrows",
        "",
        f"- package arrows (distinct importer -> imported, self-edges left out): **{fig['package_arrows']}**",
        f"- module arrows (module -> module, for reference): **{fig['module_arrows']}**",
        "",
        "| package | imports |",
        "| --- | --- |",
        *(f"| {a} | {', '.join(bs) or '-'} |" for a, bs in fig["arrows"].items()),
        "",
        "## Floors",
        "",
        f"- floors (packages on the longest import path): **{fig['floors']}**",
        f"- one longest path: {chain}",
    ]
    if fig["cycles"]:
        out.append(f"- the package graph has **{len(fig['cycles'])} cycle(s)**; each counts as one floor:")
        out += [f"  - {' <-> '.join(c)}" for c in fig["cycles"]]
    else:
        out.append("- cycles: none")
    out += _cycle_lines(fig)
    out += [
        "",
        f"## Files over {LONG_FILE} lines: {len(fig['files_over_600_lines'])}",
        "",
        "| file | lines |",
        "| --- | ---: |",
        *(f"| {f['file']} | {f['lines']} |" for f in fig["files_over_600_lines"]),
        "",
        f"## Functions of {LONG_FUNCTION} lines or more: {len(fig['functions_of_80_lines_or_more'])}",
        "",
        "| function | file | lines |",
        "| --- | --- | ---: |",
        *(f"| `{f['function']}` | {f['file']} | {f['lines']} |" for f in fig["functions_of_80_lines_or_more"]),
        "",
        *_complexity_lines(fig["complexity"]),
        "",
        "## Imports inside functions",
        "",
        f"- import statements: **{imp['total']}**",
        f"- inside a function body: **{imp['inside_functions']}** ({100 * imp['inside_functions_share']:.0f}%)",
        f"- of those, importing {fig['package']}'s own modules: **{imp['inside_functions_own']}**",
    ]
    return "\n".join(out) + "\n"


def _cycle_lines(fig: dict) -> list[str]:
    """Back-arrows of the package graph, and the module graph's cycles and back-arrows."""
    out = [f"- back-arrows (package graph): **{len(fig['back_arrows'])}**"]
    out += [f"  - {a} -> {b}" for a, b in fig["back_arrows"]]
    sizes = ", ".join(str(len(c)) for c in fig["module_cycles"]) or "-"
    out.append(f"- module graph: **{len(fig['module_cycles'])}** cycle(s) (modules in each: {sizes})")
    out.append(f"- back-arrows (module graph): **{len(fig['module_back_arrows'])}**")
    out += [f"  - {a} -> {b}" for a, b in fig["module_back_arrows"][:10]]
    if len(fig["module_back_arrows"]) > 10:
        out.append(f"  - ({len(fig['module_back_arrows']) - 10} more in the JSON)")
    return out


def _complexity_lines(cx: dict) -> list[str]:
    """The complexity section: the count, and the ten most complex functions."""
    if cx["ruff"] is None:
        return ["## Complexity (ruff C901)", "", "- ruff not found (neither beside this Python nor on PATH)"]
    out = [
        f"## Complexity (ruff C901 at max-complexity 10, {cx['ruff']}): {cx['count']} violations",
        "",
        "| function | file:line | complexity |",
        "| --- | --- | ---: |",
    ]
    out += [f"| `{v['function']}` | {v['file']}:{v['line']} | {v['complexity']} |" for v in cx["violations"][:10]]
    if cx["count"] > 10:
        out.append(f"\n({cx['count'] - 10} more in the JSON)")
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="repository root")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this path")
    args = parser.parse_args(argv)
    fig = measure(args.root)
    print(markdown(fig), end="")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(fig, indent=2) + "\n")
    return fig


if __name__ == "__main__":
    main()
