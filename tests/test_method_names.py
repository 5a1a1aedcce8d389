"""Each method's name is written once (issue 56; docs/architecture.md, "Names"; option names: test_names.py).

A registered method's name (`NAME`, CoRP's `COMMAND`) and its product (CoRP's `PRODUCT`) are each a
string literal once in corp/, on the line that declares the constant; every other module reads the
constant or the registered `Method`. The scan below finds every other string literal equal to one of
them (docstrings excluded); each is an error unless ALLOWED says why it is another concept that
happens to be spelt the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from corp import api
from corp.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]
DECLARES = {"NAME", "COMMAND", "PRODUCT"}  # the constants a method's name is declared as

# (file, literal): why that literal there is not the method's name
ALLOWED = {
    ("corp/cli.py", "corp"): "the installed distribution's name, for --version",
    ("corp/cards.py", "corp"): "the Hub tag of every model corp makes (the library's, beside the method's own tag)",
    ("corp/tracking.py", "corp"): "the default W&B project name: the library's",
    ("corp/runtime/cachedir.py", "corp"): "corp's cache directory (~/.cache/corp): the library's",
    ("corp/runtime/models/save.py", "corp"): "the save marker's written_by: the library that wrote the directory",
    ("corp/algorithms/lowrank.py", "corp"): "the factors file's safetensors metadata key (a stored format value)",
    ("corp/methods/es.py", "es"): "KIND: the recipe kind and run-definition kind es, values stored in files",
    (
        "corp/algorithms/recipe.py",
        "es",
    ): "the recipe kind es, and old recipes' made_by.method as written (to upgrade them)",
    ("corp/bench/report/prose.py", "es"): "English: the plural of 'do' ('does not fit')",
    ("corp/evaluate/tasks/countdown.py", "eval"): "ast.parse's mode='eval' (an expression)",
    ("corp/methods/ftis/run.py", "eval"): "the kind of F-TIS's evaluation rows in its metrics log",
    (
        "corp/methods/ftis/run.py",
        "grpo",
    ): "BASELINE: F-TIS's comparison arm, plain GRPO's loss name and its stored rows",
    ("corp/methods/fgrpo.py", "fgrpo"): "--aggregation fgrpo: the aggregation rule (FGRPO's relative-gain softmax)",
    (
        "corp/methods/fedcorp/run.py",
        "score",
    ): "the clients' wire message op 'score' (op_score, beside hello/probe/gate)",
    ("corp/algorithms/grpo/plain.py", "grpo"): "the loss variant's name (--loss grpo)",
    ("corp/algorithms/grpo/trainer.py", "grpo"): "the default --loss and TRL's loss aggregation 'grpo'",
}


def _names() -> dict[str, str]:
    """literal -> the method it names (its name and, where it has one, its product)."""
    out = {}
    for m in METHODS:
        out[m.name] = m.name
        if m.product:
            out[m.product] = m.name
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _declarations(tree: ast.Module) -> set[int]:
    """The literals of module-level `NAME = "..."` (COMMAND, PRODUCT): a name's one place."""
    return {
        id(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in DECLARES
        and isinstance(node.value, ast.Constant)
    }


def literals(source: str, names: dict[str, str]) -> tuple[list[tuple[int, str]], list[str]]:
    """(line, literal) of every string literal in `source` equal to a name, docstrings and declarations
    excluded; and the names it declares."""
    tree = ast.parse(source)
    skip, declared = _docstrings(tree), _declarations(tree)
    hits, decl = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            if id(node) in declared:
                decl.append(node.value)
            elif id(node) not in skip:
                hits.append((node.lineno, node.value))
    return hits, decl


def scan(root: Path, names: dict[str, str]):
    """{(file, literal): [lines]} of the literals outside their declaration, and {name: [files declaring it]}."""
    hits, declared = {}, {}
    for path in sorted((root / "corp").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        found, decl = literals(path.read_text(), names)
        for line, lit in found:
            hits.setdefault((rel, lit), []).append(line)
        for lit in decl:
            declared.setdefault(lit, []).append(rel)
    return hits, declared


@pytest.fixture(scope="module")
def scanned():
    return scan(ROOT, _names())


def test_no_module_spells_a_method_name_outside_its_declaration(scanned):
    hits, _ = scanned
    bad = [f"{f}:{lines} '{lit}'" for (f, lit), lines in hits.items() if (f, lit) not in ALLOWED]
    assert not bad, (
        "a method's name written as a literal; read its constant (NAME, COMMAND, PRODUCT) or its Method, "
        f"or add (file, literal) to ALLOWED with why it is another concept: {bad}"
    )


def test_every_name_is_declared_exactly_once(scanned):
    _, declared = scanned
    for lit in _names():
        assert len(declared.get(lit, [])) == 1, f"'{lit}' declared in {declared.get(lit)}: want exactly one place"


def test_every_allowed_literal_is_still_there(scanned):
    hits, _ = scanned
    stale = [key for key in ALLOWED if key not in hits]
    assert not stale, f"ALLOWED entries that match nothing any more (remove them): {stale}"


def test_a_planted_name_list_is_caught():
    """The case the scan exists for: lifecycle's old list of score-only methods, by name."""
    planted = '"""doc: score randopt"""\n_SCORE_ONLY = ("score", "randopt", "eval", "self-consistency")\n'
    hits, decl = literals(planted, _names())
    assert [lit for _, lit in hits] == ["score", "randopt", "eval", "self-consistency"] and not decl
    assert literals('NAME = "score"\n', _names()) == ([], ["score"])  # the declaration itself is not a hit
    assert literals('def f():\n    NAME = "score"\n', _names())[0] == [(2, "score")]  # only at module level


def test_the_python_functions_are_named_as_they_are_bound():
    """train_<product>: `train_corp` runs `corp consolidate`, named from its Method (api.py)."""
    for bound in ("train_randopt", "train_corp", "train_es", "train_grpo"):
        assert getattr(api, bound).__name__ == bound


# ---------------------------------------------------------------- what a method's run holds, said by the method

# what lifecycle once listed by method name (_SCORE_ONLY, _HOST_AFTER), now each method's own drive() argument
HOLDS = {"score": None, "randopt": None, "eval": None, "self-consistency": None, "consolidate": "after", "es": "beside"}


class _Opened(Exception):
    pass


@pytest.mark.parametrize("name", sorted(HOLDS))
def test_each_method_says_what_its_run_holds_beside_the_engine(name, monkeypatch, tmp_path):
    from corp.config import load_config
    from corp.methods import get_method
    from corp.runtime import loop

    said = {}

    def opened(cfg, method, backend=None, needs=(), defines="auto", host_copy="beside"):
        said.update(method=method, host_copy=host_copy)
        raise _Opened

    monkeypatch.setattr(loop, "open_run", opened)
    m = get_method(name)
    cfg = load_config(m.config, None, {**m.smoke, "model": "unused", "run_dir": str(tmp_path / "run")})
    with pytest.raises(_Opened):
        m.run(cfg)
    assert said["host_copy"] == HOLDS[name]


@pytest.mark.parametrize(
    ("host_copy", "executor", "counted"),
    [(None, "local", None), ("after", "local", "after"), ("after", "ray", "beside"), ("beside", "local", "beside")],
)
def test_the_memory_check_counts_the_host_copy_the_method_says(host_copy, executor, counted, monkeypatch):
    from types import SimpleNamespace

    from corp.runtime.context import lifecycle

    seen = {}
    monkeypatch.setattr(lifecycle, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(lifecycle, "resolve_backend_name", lambda backend, device: "vllm")
    monkeypatch.setattr(lifecycle, "check_memory", lambda *a, host_copy=None, **k: seen.update(host=host_copy))
    cfg = SimpleNamespace(device="cpu", backend="vllm", executor=executor, workers=2, model="m", dtype=None)
    lifecycle._check_memory(cfg, host_copy)
    assert seen["host"] == counted
