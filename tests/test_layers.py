"""The tiers, checked from the imports of every corp module (parsed with ast, nothing imported).

The folders say what code is: corp/runtime/ (engines, executors, the run layer and run directories,
models, the sandbox), corp/algorithms/ (perturbation, the CoRP operator, statistics, recipes, low-rank
factors, aggregation, the GRPO trainer), corp/evaluate/ (tasks, rewards, scoring), corp/methods/ (one
module or package per method), corp/bench/. The three first only group packages (GROUPS): each entry in
them is a package with its own floor (`runtime.backends`, `algorithms.stats`).

Four tiers, lowest first; a module imports only from its own tier or below (issue 38):

1. the core, itself in two floors: (0) corp's exceptions (`errors`), `version`, the utilities every
   tier uses (`config`, `config_types`, `registry`, `extras`, `tracking`, `cards`, `grids`, `method`:
   what a method is), the runtime that runs nothing yet (`runtime.runs`, `.cachedir`, `.ledger`,
   `.models`, `.sandbox`, `.threads`, `.progress`), the algorithms that evaluate nothing
   (`algorithms.perturb`, `.stats`, `.recipe`, `.lowrank`, `.aggregation`, `.corp_operator`) and the
   tasks and rewards (`evaluate.tasks`, `.rewards`, `.voting`); (1) what runs models: the engines and
   executors (`runtime.backends`, `.executors`, `.ray_cluster`, `.batched`, `.clients`), the run layer
   (`runtime.context`), the loop iterative methods share (`runtime.loop`), the GRPO trainer
   (`algorithms.grpo`: GRPO, F-TIS, FGRPO and FERA use it) and population scoring (`evaluate.scorer`,
   `.calibration`, `.population`, `.racing`, `.passk`, `.retention`);
2. `methods`: one module or package per method (`corp/methods/es.py`, `corp/methods/consolidate/`),
   and the registry (`corp/methods/__init__.py`), which imports each method's `METHOD`;
3. `bench`, and `api` (the Python API);
4. `cli`, and the package's own module (corp/__init__.py: the facade users import, which loads
   `corp.api` by name on first use): no corp module imports it (`CorpError` is in corp/errors.py).

Methods never import one another, not even public names: what two methods share is in the core.
A method module never imports the registry either (the registry imports it). Code above the methods
(`bench`, `api`, `cli`) imports the registry or a method's own module or package
(`from corp.methods.consolidate import ConsolidateConfig`), never a submodule of a method package
(`corp.methods.consolidate.run`: its internals, which may move), and from a package only names in
its `__all__`. No module import graph has a cycle. No module imports another module's private
(`_name`) names, and no module is named like a standard-library module (`corp/operator/` was).

Every import counts, also one inside a function (a lazy import is still a dependency), and so does
`importlib.import_module("corp.x")` with a literal name.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import corp

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("structure_counts", ROOT / "benchmarks" / "structure_counts.py")
counts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(counts)
GROUPS = counts.GROUPS  # folders that group packages: each entry is a package with its own floor

CORE_GROUND = (
    "errors",
    "version",
    "config",
    "config_types",
    "registry",
    "extras",
    "tracking",
    "cards",
    "grids",
    "method",
    *GROUPS,  # their __init__.py: a docstring
    "runtime.progress",
    "runtime.threads",
    "runtime.cachedir",
    "runtime.ledger",
    "runtime.runs",
    "runtime.models",
    "runtime.sandbox",
    "algorithms.perturb",
    "algorithms.stats",
    "algorithms.lowrank",
    "algorithms.recipe",
    "algorithms.aggregation",
    "algorithms.corp_operator",
    "evaluate.tasks",
    "evaluate.rewards",
    "evaluate.voting",
)
RUNS_MODELS = (
    "runtime.backends",
    "runtime.context",
    "runtime.batched",
    "runtime.executors",
    "runtime.ray_cluster",
    "runtime.clients",
    "runtime.loop",
    "algorithms.grpo",
    "evaluate.scorer",
    "evaluate.calibration",
    "evaluate.population",
    "evaluate.racing",
    "evaluate.passk",
    "evaluate.retention",
)
FLOORS = {
    **dict.fromkeys(CORE_GROUND, 0),
    **dict.fromkeys(RUNS_MODELS, 1),
    "methods": 2,
    "bench": 3,
    "api": 3,
    "cli": 4,
    "": 4,
}
TIERS = {"core": (0, 1), "methods": (2,), "bench": (3,), "cli": (4,)}


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package directory `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported_by_name(node: ast.AST) -> str | None:
    """The module an `importlib.import_module("corp.x")` call with a literal name imports, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    first = node.args[0]
    if name == "import_module" and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


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
            elif by_name := _imported_by_name(node):
                edges += [(by_name, (), node.lineno)] if by_name.split(".")[0] == top else []
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
    """The top-level subpackage or module under corp ("" for corp itself); in a GROUPS folder, the entry
    of that folder (corp.runtime.backends.hf -> "runtime.backends")."""
    return counts.package_of(mod)


def method_of(mod: str) -> str | None:
    """The method a module belongs to (corp.methods.es -> 'es', corp.methods.consolidate.run ->
    'consolidate'); None outside corp/methods/ and for the registry (corp.methods itself)."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "methods" else None


def exported(root: Path, module: str) -> set[str] | None:
    """The names in `__all__` of a method package's __init__.py (corp.methods.X); None for a one-file
    method or a package without `__all__` (every name of a one-file method is its surface)."""
    init = root / Path(*module.split(".")[1:]) / "__init__.py"
    if not init.exists():
        return None
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one node or a self-loop (Tarjan's
    components, from benchmarks/structure_counts.py, which counts the floors on the same graph)."""
    return [c for c in counts.strongly_connected(graph) if len(c) > 1 or c[0] in graph.get(c[0], ())]


def violations(graph: dict[str, list[tuple[str, tuple[str, ...], int]]], root: Path) -> list[str]:
    """Every break of the tier rules in an import graph (see the module docstring), one line each."""
    out = []
    for mod, edges in sorted(graph.items()):
        here = package_of(mod)
        if here not in FLOORS:
            out.append(f"{mod}: package '{here}' has no floor in tests/test_layers.py FLOORS")
            continue
        mine = method_of(mod)
        for target, names, line in edges:
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and target != mod:
                out.append(f"{mod}:{line} imports {', '.join(private)} from {target}: private names of another module")
            there = package_of(target)
            if there not in FLOORS:
                out.append(f"{mod}:{line} imports {target}, whose package has no floor")
                continue
            if FLOORS[there] > FLOORS[here]:
                floors = f"{there or 'corp'}: {FLOORS[there]} > {here or 'corp'}: {FLOORS[here]}"
                out.append(f"{mod}:{line} imports {target} from a higher floor ({floors})")
            theirs = method_of(target)
            if mine is not None and there == "methods" and theirs != mine:
                other = f"method '{theirs}'" if theirs else "the registry"
                out.append(
                    f"{mod}:{line} imports {target}: method '{mine}' imports {other}; methods never import one "
                    "another (what two methods share belongs in the core)"
                )
            elif mine is None and here != "methods" and theirs is not None:
                surface = f"corp.methods.{theirs}"
                if target != surface:
                    out.append(f"{mod}:{line} imports internal module {target}; import from {surface}")
                else:
                    public = exported(root, surface)
                    private = sorted(set(names) - public) if public is not None else []
                    if private:
                        out.append(f"{mod}:{line} imports {', '.join(private)} from {surface}, not in its __all__")
    for cycle in cycles({m: {t for t, _, _ in e} for m, e in graph.items()}):
        out.append("import cycle: " + " <-> ".join(cycle))
    return out


def _corp_graph():
    root = Path(corp.__file__).parent
    return import_graph(root), root


def test_corp_keeps_its_tiers():
    graph, root = _corp_graph()
    assert len(graph) > 50  # every module was read
    assert violations(graph, root) == []


def test_every_corp_package_has_a_floor():
    graph, _ = _corp_graph()
    assert {package_of(m) for m in graph} <= set(FLOORS)


def test_the_tiers_are_the_folders():
    """The tiers are what the tree shows: every method lives under corp/methods/, no method folder
    (nor the GRPO trainer, which four methods share) is left at corp's top level, what runs models is
    under corp/runtime/ and what methods share under corp/algorithms/, and every floor belongs to one tier."""
    root = Path(corp.__file__).parent
    assert {f for fs in TIERS.values() for f in fs} == set(FLOORS.values())
    moved = ("baselines", "federated", "analysis", "consolidate", "grpo", "operator", "perturb", "models", "sandbox")
    for old in moved:
        assert not (root / old).exists(), f"corp/{old}/ is at corp's top level; see the module docstring for its folder"
    for old in ("runs", "stats", "loop", "recipe", "lowrank", "clients", "ledger", "threads", "cachedir"):
        assert not (root / f"{old}.py").exists(), f"corp/{old}.py is at corp's top level"
    for group in GROUPS:
        body = ast.parse((root / group / "__init__.py").read_text()).body
        assert len(body) == 1 and isinstance(body[0].value, ast.Constant), f"corp/{group}/ only groups packages"
    graph, _ = _corp_graph()
    assert set(FLOORS) <= {package_of(m) for m in graph} | {""}, "a floor names a package that is not there"
    from corp.methods import METHODS

    for m in METHODS:
        assert m.run.__module__.startswith("corp.methods.") or m.run.__module__.startswith("corp.evaluate."), m.name


def shadowed_stdlib(root: Path) -> list[str]:
    """The package's modules and folders named like a standard-library module (`corp/operator/`: with its
    folder on sys.path, as when a file of it runs as a script, `import operator` finds it)."""
    names = {p.stem if p.suffix == ".py" else p.name for p in root.rglob("*") if p.suffix == ".py" or p.is_dir()}
    return sorted(names & set(sys.stdlib_module_names))


def test_no_module_shadows_the_standard_library(tmp_path):
    assert shadowed_stdlib(ROOT / "corp") == []
    planted = _tree(tmp_path, {"operator/__init__.py": "", "evaluate/tasks/code.py": ""})
    assert shadowed_stdlib(planted) == ["code", "operator"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "corp"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _check(root: Path) -> list[str]:
    return violations(import_graph(root), root)


GROUP_INITS = {f"{g}/__init__.py": '"""a folder of packages"""\n' for g in GROUPS}


def test_a_clean_fake_tree_passes(tmp_path):
    root = _tree(
        tmp_path,
        {
            **GROUP_INITS,
            "__init__.py": "import importlib\nfrom corp.errors import CorpError\n"
            "def __getattr__(name):\n    return importlib.import_module('corp.api')\n",  # the facade, on top
            "errors.py": "class CorpError(Exception): ...\n",
            "runtime/ledger.py": "from corp.errors import CorpError\n",
            "algorithms/recipe.py": "from corp.runtime.ledger import Ledger\n",  # core, ground floor
            "method.py": "from corp.runtime.ledger import Ledger\n",
            "runtime/context/__init__.py": "from corp.runtime.ledger import Ledger\nfrom corp.evaluate.tasks import T\n",
            "evaluate/tasks/__init__.py": "from corp.algorithms.recipe import make_recipe\n",
            "runtime/clients.py": "from corp.runtime.context import RunContext\n",  # core, floor 1
            "methods/__init__.py": "from corp.methods import es\nfrom corp.methods.consolidate import METHOD\n",
            "methods/consolidate/__init__.py": "from corp.methods.consolidate.run import METHOD\n__all__ = ['METHOD']\n",
            "methods/consolidate/run.py": "from corp.runtime.context import RunContext\nfrom corp.method import M\n",
            "methods/es.py": "from corp.algorithms.recipe import make_recipe\nfrom corp.runtime.clients import split\n",
            "bench/__init__.py": "from corp.methods import get_method\nfrom corp.methods.es import ESConfig\n",
            "api.py": "from corp.methods import get_method\n",
            "cli.py": "from corp import CorpError\ndef main():\n    from corp.methods.consolidate import METHOD\n",
        },
    )
    assert _check(root) == []


def test_planted_violations_are_caught(tmp_path):
    """Each rule fails on a tree that breaks it (the checker can fail), including lazy and relative imports."""
    root = _tree(
        tmp_path,
        {
            **GROUP_INITS,
            "__init__.py": "import importlib\ndef f():\n    return importlib.import_module('corp.api')\n",
            "api.py": "",
            "errors.py": "",
            "runtime/ledger.py": "def f():\n    from corp.bench import sweep\n",  # upward, lazily
            "runtime/runs.py": "from corp.algorithms import stats\n",
            "algorithms/stats.py": "from ..runtime import runs\n",  # a cycle, one side relative
            "algorithms/perturb.py": "from corp import CorpError\n",  # the facade, which loads corp.api: back up
            "algorithms/lowrank.py": "import importlib\nimportlib.import_module('corp.runtime.context')\n",  # by name
            "runtime/context/__init__.py": "from corp.methods.consolidate import make_recipe\n",  # upward
            "runtime/context/keys.py": "from corp.runtime.runs import _lock\n",  # another module's private name
            "methods/__init__.py": "from corp.methods import es\n",
            "methods/consolidate/__init__.py": "from corp.methods.consolidate.recipe import make_recipe\n"
            "__all__ = ['make_recipe']\n",
            "methods/consolidate/recipe.py": "from corp.methods import es\n",  # another method
            "methods/consolidate/corp_operator.py": "_mean = 0\n",
            "methods/es.py": "from corp.methods.consolidate.recipe import make_recipe\n"  # another method's internals
            "from corp.methods.consolidate import make_recipe\n",  # another method's public name
            "methods/fedcorp/__init__.py": "",
            # another method's name, lazily, and no cycle: refused too (what two methods share is in the core)
            "methods/fedcorp/run.py": "def run():\n    from corp.methods.es import run_es\n",
            "methods/fera.py": "from corp.methods import get_method\n",  # the registry, from a method
            "bench/__init__.py": "",
            "bench/sweep.py": "from corp.methods.consolidate.recipe import make_recipe\n"  # internals, from above
            "from corp.methods.consolidate import _mean\n",  # not in the package's __all__
            "shiny/__init__.py": "",  # a package nobody gave a floor
            "runtime/shiny.py": "",  # nor an entry of a grouping folder
        },
    )
    found = "\n".join(_check(root))
    assert "corp.runtime.ledger:2 imports corp.bench.sweep from a higher floor" in found
    assert "corp.runtime.context:1 imports corp.methods.consolidate from a higher floor" in found
    assert "import cycle: corp.algorithms.stats <-> corp.runtime.runs" in found
    assert "corp.algorithms.perturb:1 imports corp from a higher floor (corp: 4 > algorithms.perturb: 0)" in found
    assert "corp.algorithms.lowrank:2 imports corp.runtime.context from a higher floor" in found
    assert "corp.runtime.context.keys:1 imports _lock from corp.runtime.runs: private names of another module" in found
    peer = "methods never import one another"
    assert f"corp.methods.fedcorp.run:2 imports corp.methods.es: method 'fedcorp' imports method 'es'; {peer}" in found
    assert (
        "corp.methods.es:1 imports corp.methods.consolidate.recipe: method 'es' imports method 'consolidate'" in found
    )
    assert "corp.methods.es:2 imports corp.methods.consolidate: method 'es' imports method 'consolidate'" in found
    assert (
        "corp.methods.consolidate.recipe:1 imports corp.methods.es: method 'consolidate' imports method 'es'" in found
    )
    assert "corp.methods.fera:1 imports corp.methods: method 'fera' imports the registry" in found
    assert "corp.bench.sweep:1 imports internal module corp.methods.consolidate.recipe" in found
    assert "corp.bench.sweep:2 imports _mean from corp.methods.consolidate, not in its __all__" in found
    cycle = " <-> ".join(("corp.methods.consolidate", "corp.methods.consolidate.recipe", "corp.methods.es"))
    assert f"import cycle: {cycle}" in found
    assert "package 'shiny' has no floor" in found
    assert "package 'runtime.shiny' has no floor" in found


def test_a_back_arrow_through_the_facade_is_a_cycle(tmp_path):
    """`from corp import CorpError` below the API closes a circle through the facade's import by name."""
    root = _tree(
        tmp_path,
        {
            **GROUP_INITS,
            "__init__.py": "import importlib\ndef __getattr__(name):\n    return importlib.import_module('corp.api')\n",
            "api.py": "from corp.methods import get_method\n",
            "methods/__init__.py": "from corp.runtime.runs import open_run\n",
            "runtime/runs.py": "from corp import CorpError\n",
        },
    )
    found = _check(root)
    assert "import cycle: corp <-> corp.api <-> corp.methods <-> corp.runtime.runs" in found
    assert "corp.runtime.runs:1 imports corp from a higher floor (corp: 4 > runtime.runs: 0)" in found


# The engine modules load their engines (transformers' generation stack, vLLM) when a backend is
# built, not when corp is imported: `corp --help` and every command that never generates stay fast.
# Every other import of corp's own modules sits at the top of its file.
LAZY_MODULES = ("corp.runtime.backends.hf", "corp.runtime.backends.vllm")


def imports_inside_functions(root: Path) -> list[str]:
    """'module:line target' for every import of the package's own modules inside a function body,
    except of LAZY_MODULES (relative imports resolved as import_graph does)."""
    top = root.name
    out = []
    for mod, path in module_files(root).items():
        tree = ast.parse(path.read_text(), str(path))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = package.split(".")[: len(package.split(".")) - node.level + 1]
                        targets = [".".join(base + ([node.module] if node.module else []))]
                    else:
                        targets = [node.module or ""]
                    targets = [
                        f"{targets[0]}.{a.name}" if f"{targets[0]}.{a.name}" in LAZY_MODULES else targets[0]
                        for a in node.names
                    ]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                for target in targets:
                    if target.split(".")[0] == top and target not in LAZY_MODULES:
                        out.append(f"{mod}:{node.lineno} {target}")
    return sorted(set(out))


def test_corp_imports_its_own_modules_at_the_top_of_files():
    assert imports_inside_functions(ROOT / "corp") == []


def test_an_import_inside_a_function_is_caught(tmp_path):
    root = _tree(
        tmp_path,
        {
            "runtime/backends/hf.py": "",
            "runtime/backends/__init__.py": "def make():\n    from corp.runtime.backends.hf import X\n",
            "stats.py": "def f():\n    from corp import runs\n    from . import ledger\n    import corp.models\n",
        },
    )
    assert imports_inside_functions(root) == ["corp.stats:2 corp", "corp.stats:3 corp", "corp.stats:4 corp.models"]
