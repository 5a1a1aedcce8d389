"""The layer order, checked from the imports of every corp module (parsed with ast, nothing imported).

Floors, lowest first; a module imports only from its own floor or below:

0. ground floor: `corp` itself, `perturb`, `models`, `stats`, `ledger`, `registry`, `runs`, `threads`,
   `extras`, `config`, `cards`, `tracking`, and what methods share that evaluates nothing: `recipe`
   (the recipe), `lowrank` (low-rank factors, LowRankDirection and its factors file, the r* table),
   `aggregation` (federated aggregation rules), `operator` (the CoRP operator: stage 1, merge rules,
   Gram matrix, gate)
1. `evaluate` (tasks, rewards, backends, the run layer `evaluate/context.py`, population scoring),
   `clients` (the federated client split, messages and pool; it reads the tasks' examples)
2. the algorithm packages `analysis`, `consolidate`, `baselines`, `federated`
3. `methods` (the registry)
4. `bench`, `api` (the Python API; `corp/__init__.py` loads it by name, on first use)
5. `cli`

Floors 0-1 are the core. An algorithm package never imports another algorithm package, not even its
public names: what two methods share lives in the core (issue 38), so `corp.baselines.es` takes the
recipe from `corp.recipe`, not from `corp.consolidate`.

What a "public" import of an algorithm package is: a name listed in that package's `__all__`
(its `__init__.py`), imported from the package itself (`from corp.consolidate import run_consolidate`).
Code above the package (`methods`, `bench`, `api`, `cli`) never imports one of its submodules
(`corp.consolidate.run`): those are the package's internals and may move. No module import graph
has a cycle.

Every import counts, also one inside a function (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import corp

ROOT = Path(__file__).resolve().parents[1]

FLOORS = {
    **dict.fromkeys(
        (
            "",
            "perturb",
            "models",
            "stats",
            "ledger",
            "registry",
            "runs",
            "threads",
            "extras",
            "config",
            "cards",
            "tracking",
            "recipe",
            "lowrank",
            "aggregation",
            "operator",
        ),
        0,
    ),
    "evaluate": 1,
    "clients": 1,
    **dict.fromkeys(("analysis", "consolidate", "baselines", "federated"), 2),
    "methods": 3,
    "bench": 4,
    "api": 4,
    "cli": 5,
}
ALGORITHMS = {"analysis", "consolidate", "baselines", "federated"}


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package directory `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(root: Path) -> dict[str, list[tuple[str, tuple[str, ...], int]]]:
    """module -> [(imported module, names taken from it, line)] over every import statement in it.
    `from corp.x import y` names module corp.x.y when that is a module, else takes name y of corp.x."""
    files = module_files(root)
    top = root.name
    graph: dict[str, list[tuple[str, tuple[str, ...], int]]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges += [(a.name, (), node.lineno) for a in node.names if a.name.split(".")[0] == top]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != top:
                    continue
                names = []
                for a in node.names:
                    if f"{target}.{a.name}" in files:
                        edges.append((f"{target}.{a.name}", (), node.lineno))
                    else:
                        names.append(a.name)
                if names or not node.names:
                    edges.append((target, tuple(names), node.lineno))
        graph[mod] = edges
    return graph


def package_of(mod: str) -> str:
    """The top-level subpackage or module under corp ("" for corp itself)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def exported(root: Path, package: str) -> set[str]:
    """The names in `__all__` of corp.<package>'s __init__.py (none when it has no __all__)."""
    init = root / package / "__init__.py"
    if not init.exists():
        return set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one node or a self-loop (Tarjan's
    components, from benchmarks/structure_counts.py, which counts the floors on the same graph)."""
    spec = importlib.util.spec_from_file_location("structure_counts", ROOT / "benchmarks" / "structure_counts.py")
    counts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counts)
    return [c for c in counts.strongly_connected(graph) if len(c) > 1 or c[0] in graph.get(c[0], ())]


def violations(graph: dict[str, list[tuple[str, tuple[str, ...], int]]], exports: dict[str, set[str]]) -> list[str]:
    """Every break of the layer rules in an import graph (see the module docstring), one line each."""
    out = []
    for mod, edges in sorted(graph.items()):
        here = package_of(mod)
        if here not in FLOORS:
            out.append(f"{mod}: package '{here}' has no floor in tests/test_layers.py FLOORS")
            continue
        for target, names, line in edges:
            there = package_of(target)
            if there not in FLOORS:
                out.append(f"{mod}:{line} imports {target}, whose package has no floor")
                continue
            if FLOORS[there] > FLOORS[here]:
                floors = f"{there}: {FLOORS[there]} > {here}: {FLOORS[here]}"
                out.append(f"{mod}:{line} imports {target} from a higher floor ({floors})")
            if there in ALGORITHMS and there != here:
                if here in ALGORITHMS:
                    out.append(
                        f"{mod}:{line} imports {target}: algorithm packages never import each other "
                        f"({here} -> {there}); what two methods share belongs in the core (floors 0-1)"
                    )
                elif target != f"corp.{there}":
                    out.append(f"{mod}:{line} imports internal module {target}; import from corp.{there} (its __all__)")
                else:
                    private = sorted(set(names) - exports.get(there, set()))
                    if private:
                        out.append(f"{mod}:{line} imports {', '.join(private)} from corp.{there}, not in its __all__")
    for cycle in cycles({m: {t for t, _, _ in e} for m, e in graph.items()}):
        out.append("import cycle: " + " <-> ".join(cycle))
    return out


def _corp_graph():
    root = Path(corp.__file__).parent
    return import_graph(root), {p: exported(root, p) for p in ALGORITHMS}


def test_corp_keeps_its_layer_order():
    graph, exports = _corp_graph()
    assert len(graph) > 50  # every module was read
    assert violations(graph, exports) == []


def test_every_corp_package_has_a_floor():
    graph, _ = _corp_graph()
    assert {package_of(m) for m in graph} <= set(FLOORS)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "corp"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _check(root: Path) -> list[str]:
    return violations(import_graph(root), {p: exported(root, p) for p in ALGORITHMS})


def test_a_clean_fake_tree_passes(tmp_path):
    root = _tree(
        tmp_path,
        {
            "ledger.py": "",
            "recipe.py": "from corp.ledger import Ledger\n",  # core, ground floor
            "evaluate/__init__.py": "",
            "evaluate/context.py": "from corp.ledger import Ledger\n",
            "clients.py": "from corp.evaluate.context import RunContext\n",  # core, floor 1
            "consolidate/__init__.py": "from corp.consolidate.run import run_consolidate\n__all__ = ['run_consolidate']\n",
            "consolidate/run.py": "from corp.evaluate.context import RunContext\nfrom corp.recipe import make_recipe\n",
            "baselines/__init__.py": "from .es import run_es\n__all__ = ['run_es']\n",
            "baselines/es.py": "from corp.recipe import make_recipe\nfrom corp.clients import split_clients\n",  # shared: core
            "methods/__init__.py": "from corp.baselines import run_es\nfrom corp.consolidate import run_consolidate\n",
            "cli.py": "def main():\n    from corp.baselines import run_es\n",
        },
    )
    assert _check(root) == []


def test_planted_violations_are_caught(tmp_path):
    """Each rule fails on a tree that breaks it (the checker can fail), including lazy and relative imports."""
    root = _tree(
        tmp_path,
        {
            "ledger.py": "def f():\n    from corp.bench import sweep\n",  # upward, lazily
            "runs.py": "from corp import stats\n",
            "stats.py": "from . import runs\n",  # a cycle, one side relative
            "evaluate/__init__.py": "",
            "evaluate/context.py": "from corp.consolidate import make_recipe\n",  # upward
            "consolidate/__init__.py": "from corp.consolidate.recipe import make_recipe\n__all__ = ['make_recipe']\n",
            "consolidate/recipe.py": "from corp.baselines import run_es\n",  # a peer
            "consolidate/corp_operator.py": "_mean = 0\n",
            "baselines/__init__.py": "from corp.baselines.es import run_es\n__all__ = ['run_es']\n",
            "baselines/es.py": "from corp.consolidate.recipe import make_recipe\n"  # a peer's internal module
            "from corp.consolidate import _mean\n",  # a peer, a name not in its __all__
            "bench/__init__.py": "",
            "bench/sweep.py": "",
            "federated/__init__.py": "",
            "federated/clients.py": "",
            # a peer's public name, lazily, and no cycle: refused too (what two methods share is in the core)
            "federated/fedcorp.py": "def run():\n    from corp.consolidate import make_recipe\n",
            "methods/__init__.py": "from corp.consolidate.recipe import make_recipe\n"  # internals, from above
            "from corp.consolidate import _mean\n",  # not in the package's __all__
            "bench/adapters.py": "from corp.federated.clients import split_clients\n",  # internals, from above
            "shiny/__init__.py": "",  # a package nobody gave a floor
        },
    )
    found = "\n".join(_check(root))
    assert "corp.ledger:2 imports corp.bench.sweep from a higher floor" in found
    assert "corp.evaluate.context:1 imports corp.consolidate from a higher floor" in found
    assert "import cycle: corp.runs <-> corp.stats" in found
    peer = "algorithm packages never import each other"
    assert f"corp.federated.fedcorp:2 imports corp.consolidate: {peer} (federated -> consolidate)" in found
    assert f"corp.baselines.es:1 imports corp.consolidate.recipe: {peer} (baselines -> consolidate)" in found
    assert f"corp.baselines.es:2 imports corp.consolidate: {peer} (baselines -> consolidate)" in found
    assert f"corp.consolidate.recipe:1 imports corp.baselines: {peer} (consolidate -> baselines)" in found
    assert "corp.methods:1 imports internal module corp.consolidate.recipe" in found
    assert "corp.methods:2 imports _mean from corp.consolidate, not in its __all__" in found
    assert "corp.bench.adapters:1 imports internal module corp.federated.clients" in found
    cycle = " <-> ".join(("corp.baselines", "corp.baselines.es", "corp.consolidate", "corp.consolidate.recipe"))
    assert f"import cycle: {cycle}" in found
    assert "package 'shiny' has no floor" in found
