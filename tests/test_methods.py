"""Every registered method, on a tiny random model: it runs, writes its report (and recipe, model)
in the shared schema, a second run on the same run directory generates nothing, and where it has a
recipe, `apply_recipe` rebuilds its saved model bit-exactly. Also: the registry's entries are
complete, the CLI has one command per method, renamed flags warn, optional dependencies fail in one
line (and a broken vllm.py is not reported as a missing vLLM)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from corp.config import RunConfig, field_docs, flag, load_config
from corp.errors import CorpError
from corp.methods import METHODS, REGISTRY

NAMES = [m.name for m in METHODS]
# what every smoke run here gets on top of the registry's smoke options: the tiny model, arith, a
# reward that moves whenever the output text moves (a random 32-wide model never gets arith right)
COMMON = {"task": "arith", "reward": "tests.test_methods:text_checksum", "seed": 1}
# CoRP's gate would rightly reject a random update; forced open so the saved model is not the base
# and the bit-exact rebuild below compares real weights
STRONGER = {"consolidate": {"gate_z": -10.0}}


def text_checksum(completions, **_):
    return [(sum(map(ord, c)) % 97) / 96 for c in completions]


@contextmanager
def count_model_calls():
    """Counts every generate() and every forward pass of the (tiny Llama) model, however reached."""
    from transformers import LlamaForCausalLM
    from transformers.generation.utils import GenerationMixin

    calls = {"generate": 0, "forward": 0}
    real_generate, real_forward = GenerationMixin.generate, LlamaForCausalLM.forward

    def generate(self, *a, **k):
        calls["generate"] += 1
        return real_generate(self, *a, **k)

    def forward(self, *a, **k):
        calls["forward"] += 1
        return real_forward(self, *a, **k)

    GenerationMixin.generate, LlamaForCausalLM.forward = generate, forward
    try:
        yield calls
    finally:
        GenerationMixin.generate, LlamaForCausalLM.forward = real_generate, real_forward


_RUNS: dict[str, dict] = {}


def smoke_run(name: str, tiny_dir: Path, root: Path) -> dict:
    """Run method `name` twice on the same run directory (cached per module)."""
    if name in _RUNS:
        return _RUNS[name]
    m = REGISTRY[name]
    if m.smoke is None:
        pytest.skip(f"{name} cannot run on a tiny model: {m.no_smoke}")
    run_dir = root / name
    options = {**m.smoke, **COMMON, **STRONGER.get(name, {}), "model": str(tiny_dir), "run_dir": str(run_dir)}
    with count_model_calls() as first:
        report = m(load_config(m.config, None, options))
    with count_model_calls() as second:
        again = m(load_config(m.config, None, options))
    _RUNS[name] = {"run_dir": run_dir, "report": report, "again": again, "first": dict(first), "second": dict(second)}
    return _RUNS[name]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.mark.parametrize("name", NAMES)
def test_method_runs_reports_and_resumes_without_recomputing(name, tiny_dir, runs_root):
    from corp.runtime.runs import REPORT_SCHEMA

    m = REGISTRY[name]
    r = smoke_run(name, tiny_dir, runs_root)
    run_dir = r["run_dir"]
    assert r["first"]["generate"] > 0, "the first run generated nothing: the check below would prove nothing"
    report = json.loads((run_dir / m.report).read_text())
    assert Path(report["run_dir"]) == run_dir and report["model"] == str(tiny_dir)
    if m.report == "report.json":  # the shared schema (an in-place analysis writes its own file: see Method.report)
        assert report["schema"] == REPORT_SCHEMA
        assert report["method"] == name or report["method"].startswith(name + "-"), report["method"]
        assert report["task"] == "arith"
        assert isinstance(report["rows"], list)
        for row in report["rows"]:
            assert {"method", "accuracy", "passes_per_example", "labelled_examples", "ledger"} <= set(row), row
    assert (run_dir / "recipe.json").exists() == bool(m.recipes)
    assert (run_dir / "model" / "config.json").exists() == m.model
    # resume: nothing generated or forwarded again, the same rows
    assert r["second"] == {"generate": 0, "forward": 0}, (
        f"second run on the same run directory recomputed: {r['second']}"
    )
    assert r["again"].get("rows") == r["report"].get("rows")


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.parametrize("name", [m.name for m in METHODS if m.recipes])
def test_recipe_rebuilds_the_saved_model_bit_exactly(name, tiny_dir, runs_root, tmp_path):
    from corp.algorithms.recipe import apply_recipe

    m = REGISTRY[name]
    run_dir = smoke_run(name, tiny_dir, runs_root)["run_dir"]
    recipe = json.loads((run_dir / "recipe.json").read_text())
    assert recipe.get("kind") in m.recipes, recipe.get("kind")
    out = apply_recipe(run_dir / "recipe.json", tmp_path / "rebuilt")
    saved, rebuilt, base = _tensors(run_dir / "model"), _tensors(Path(out)), _tensors(tiny_dir)
    assert saved.keys() == rebuilt.keys()
    for k in saved:
        assert torch.equal(saved[k], rebuilt[k]), k
    assert any(not torch.equal(saved[k], base[k]) for k in saved), (
        "the saved model is the base: the rebuild check proved nothing"
    )


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_is_complete(name):
    m = REGISTRY[name]
    cls = m.config
    assert dataclasses.is_dataclass(cls) and issubclass(cls, RunConfig)
    docs = field_docs(cls)
    undocumented = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert not undocumented, f"{name}: fields without a docstring (the CLI help): {undocumented}"
    assert m.help and "\n" not in m.help
    from corp.algorithms.recipe import RECIPE_KINDS

    assert set(m.recipes) <= set(RECIPE_KINDS), f"{name}: recipe kinds {m.recipes} that `corp apply` cannot rebuild"
    if m.smoke is not None:
        load_config(cls, None, {**m.smoke, **COMMON})  # the smoke options are valid options


def test_a_method_with_both_or_neither_smoke_and_no_smoke_is_refused_where_it_is_made():
    """Planted: the two entries a registry line could get wrong; an entry that names neither would be
    skipped silently by every smoke test, one that names both would say it cannot run and run."""
    from corp.methods import Method

    ok = Method(name="toy", config=RunConfig, run=lambda cfg: {}, help="a toy", smoke={"n_test": 2})
    assert ok.smoke == {"n_test": 2}
    for smoke, no_smoke in [(None, None), ({"n_test": 2}, "needs a GPU")]:
        with pytest.raises(ValueError, match="toy"):
            Method(name="toy", config=RunConfig, run=lambda cfg: {}, help="a toy", smoke=smoke, no_smoke=no_smoke)


def test_from_run_through_the_cli_reuses_a_scored_population(tiny_dir, runs_root, tmp_path):
    """`corp score`, then `corp randopt --from-run` (and the deprecated --population-from): the
    population is read from the scored run, none is scored again."""
    from typer.testing import CliRunner

    from corp.cli import app

    source = smoke_run("score", tiny_dir, runs_root)["run_dir"]
    options = {**REGISTRY["randopt"].smoke, **COMMON, "model": str(tiny_dir)}
    flags = [x for k, v in options.items() for x in (flag(k, REGISTRY["randopt"].config), str(v))]
    for i, how in enumerate(["--from-run", "--population-from"]):
        run = tmp_path / f"r{i}"
        with count_model_calls() as calls:
            res = CliRunner().invoke(app, ["randopt", *flags, how, str(source), "--output-dir", str(run)])
        assert res.exit_code == 0, res.output
        assert "randopt-top1" in res.output and f"from {source}" in res.output
        assert not (run / "population.jsonl").exists()
        k = max(int(x) for x in options["top_k"].split(","))  # test split fits one batch: one generate per model
        assert calls["generate"] <= 1 + k, "only test-split evaluations (base + top-K), no population scoring"
        report = json.loads((run / "report.json").read_text())
        assert report["population"]["source"]["from"] == str(source) and report["population"]["n"] == 3


def test_a_method_added_as_the_docs_say_runs_through_the_cli_and_the_bench(tiny_dir, tmp_path, monkeypatch):
    """docs/development.md: a method is one module plus one registry line. tests/toy_method.py is such
    a module (its config, its run, its METHOD with a bench adapter; no method the CLI or the bench could
    list by hand). Registered as the registry line would register it, it becomes `corp toy`, whose
    options are its config's fields with their defaults in --help and whose run gets the parsed values,
    and `corp bench` runs it as its adapter says: a fixed cell whose row reaches the results."""
    import csv

    from typer.testing import CliRunner

    import corp.cli as cli
    from corp.bench.config import BenchConfig
    from corp.bench.sweep import run_bench
    from corp.methods import REGISTRY
    from tests import toy_method
    from tests.test_bench import tiny_options

    toy = toy_method.METHOD
    monkeypatch.setitem(REGISTRY, toy.name, toy)  # what its line in corp/methods/__init__.py does
    monkeypatch.setattr(cli.app, "registered_commands", list(cli.app.registered_commands))
    cli.method_command(toy)  # what corp.cli does for every registered method at import
    helped = CliRunner().invoke(cli.app, ["toy", "--help"])
    assert helped.exit_code == 0, helped.output
    assert "--passes" in helped.output and "(default: 1)" in helped.output

    options = {**toy.smoke, **COMMON, "model": str(tiny_dir), "passes": 2}
    flags = [x for k, v in options.items() for x in (flag(k, toy.config), str(v))]
    res = CliRunner().invoke(cli.app, ["toy", *flags, "--output-dir", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert "toy ran" in res.output  # its own summary
    report = json.loads((tmp_path / "cli" / "report.json").read_text())
    assert report["method"] == "toy" and report["passes"] == 2 and report["n_test"] == 4
    bad = CliRunner().invoke(cli.app, ["toy", *flags, "--passes", "0", "--output-dir", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "--passes" in bad.output  # its validate(): one error line naming the option

    over = dict(budgets=[1e8], settings=["paper"], compare=[], seeds=[1], methods={"toy": {"options": {"passes": 2}}})
    summary = run_bench(load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), "corp bench (toy)")
    assert "toy" not in summary["missing"]
    rows = list(csv.DictReader(open(tmp_path / "results" / "tiny" / "results.csv")))
    toy_rows = [r for r in rows if r["method"] == "toy"]
    assert toy_rows and all(int(r["passes_per_example"]) == 2 for r in toy_rows), rows


def test_renamed_options_warn_and_map_to_the_new_field(tmp_path):
    from corp.config import RandOptConfig
    from corp.methods.analyze_rank.config import AnalyzeRankConfig

    pop = tmp_path / "pop"
    pop.mkdir()
    (pop / "population.jsonl").write_text("")
    with pytest.warns(FutureWarning, match="--population-from is deprecated; use --from-run"):
        cfg = load_config(RandOptConfig, None, {"population_from": str(pop)})
    assert cfg.from_run == str(pop) and cfg.population_from == str(pop)
    with pytest.warns(FutureWarning, match="--alpha is deprecated; use --significance"):
        cfg = load_config(AnalyzeRankConfig, None, {"alpha": 0.1, "run": str(pop)})
    assert cfg.significance == 0.1 and cfg.from_run == str(pop) and cfg.run == str(pop)
    # with another --run-dir, the analysis goes there, not into the source run
    cfg = load_config(AnalyzeRankConfig, None, {"from_run": str(pop), "run_dir": str(tmp_path / "elsewhere")})
    assert cfg.run is None
    with pytest.raises(CorpError, match="--population-from is the old name of --from-run; give only --from-run"):
        load_config(RandOptConfig, None, {"population_from": str(pop), "from_run": str(tmp_path)})
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"population_from: {pop}\n")
    with pytest.warns(FutureWarning, match="key 'population_from' is deprecated; use 'from_run'"):
        assert load_config(RandOptConfig, str(yaml_file)).from_run == str(pop)


def test_unknown_option_is_one_line(tmp_path):
    from corp.config import RandOptConfig

    with pytest.raises(CorpError, match="unknown option"):
        load_config(RandOptConfig, None, {"no_such_option": 1})


def test_missing_optional_package_is_one_line(monkeypatch):
    from corp import extras

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(CorpError) as exc:
        extras.require("peft", "--lora-r")
    assert str(exc.value) == "--lora-r needs peft; install it with `pip install 'corp[peft]'`"


def test_every_declared_extra_is_installable():
    """The command `require` prints must work: each extra it names exists in pyproject.toml."""
    import tomllib

    from corp.extras import EXTRAS
    from tests.conftest import REPO

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {e.extra for e in EXTRAS.values()} <= set(extras)


def test_missing_vllm_is_the_require_message(monkeypatch):
    from corp.runtime.backends import make_backend

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(CorpError, match=r"--backend vllm needs vllm; install it with `pip install 'corp\[vllm\]'`"):
        make_backend("vllm", "unused")


def test_an_import_error_inside_the_vllm_backend_is_not_masked(monkeypatch):
    """vLLM installed but corp's vllm.py fails to import: that ImportError must surface as itself,
    not as 'vLLM is not available' (which sent people looking in the wrong place)."""
    from corp.runtime import backends
    from corp.runtime.backends import make_backend

    monkeypatch.setattr(backends, "require", lambda package, feature: None)  # pretend vLLM is installed
    monkeypatch.setitem(sys.modules, "corp.runtime.backends.vllm", None)  # importing it raises ImportError
    with pytest.raises(ImportError):
        make_backend("vllm", "unused")


MODEL_METHODS = [m.name for m in METHODS if m.model]


def test_every_saved_model_has_a_card_and_loads_in_plain_transformers(tiny_dir, runs_root, tmp_path):
    """consolidate, es, grpo, fedcorp, fgrpo (and `corp apply`): RUN_DIR/model carries a model card
    (base and its weights hash, method and recipe, labelled data, results with intervals, license,
    load and lm-eval commands), and a fresh interpreter loads it with transformers alone."""
    import subprocess

    from huggingface_hub import ModelCard

    from corp.algorithms.recipe import apply_recipe

    assert set(MODEL_METHODS) >= {"consolidate", "es", "grpo", "fedcorp", "fgrpo"}, MODEL_METHODS
    dirs = []
    for name in MODEL_METHODS:
        run_dir = smoke_run(name, tiny_dir, runs_root)["run_dir"]
        card = ModelCard.load(run_dir / "model" / "README.md")
        text = card.text
        report = json.loads((run_dir / "report.json").read_text())
        assert card.data.library_name == "transformers", card.data
        assert any(t == name or t.startswith(name + "-") for t in card.data.tags), card.data.tags
        assert f"`{name}" in text and "arith" in text, name
        h = (
            json.loads((run_dir / "recipe.json").read_text())["base_weights_hash"]
            if (run_dir / "recipe.json").exists()
            else None
        )
        assert (h or "base weights sha256") in text, name
        assert "## Labelled data used" in text and "support:" in text, name
        for row in report["rows"]:
            assert f"| {row['method']} | {row['accuracy']:.3f} |" in text, (name, row["method"])
        if report["comparisons"]:
            assert "paired 95% CI" in text, name
        assert "## License" in text and "corp eval --model . --task arith" in text
        assert "lm_eval" not in text, "arith has no lm-evaluation-harness task: no line that pretends it does"
        assert text.split("\n# ", 1)[1].split("\n")[2].startswith("**These weights are"), "first: what they are"
        assert str(runs_root) not in text and str(tiny_dir) not in text, "an absolute path of this machine"
        if (run_dir / "recipe.json").exists():
            assert "corp apply ../recipe.json" in text
        dirs.append(str(run_dir / "model"))
    rebuilt = apply_recipe(
        smoke_run("consolidate", tiny_dir, runs_root)["run_dir"] / "recipe.json", tmp_path / "applied"
    )
    text = (Path(rebuilt) / "README.md").read_text()
    assert "corp apply" in text and "| corp |" in text
    assert str(runs_root) not in text and str(tmp_path) not in text, "an absolute path of this machine"
    dirs.append(str(rebuilt))
    code = (
        "import sys, torch\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "for d in sys.argv[1:]:\n"
        "    m = AutoModelForCausalLM.from_pretrained(d); t = AutoTokenizer.from_pretrained(d)\n"
        "    out = m.generate(**t('1+1=', return_tensors='pt'), max_new_tokens=2, do_sample=False)\n"
        "    assert out.shape[1] > 0\n"
        "assert not any(k == 'corp' or k.startswith('corp.') for k in sys.modules), 'corp was imported'\n"
        "print('loaded', len(sys.argv) - 1)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", code, *dirs], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )
    assert res.returncode == 0 and f"loaded {len(dirs)}" in res.stdout, res.stderr[-2000:]


def test_model_dir_without_a_card_is_one_note_and_still_evaluated(tiny_dir, tmp_path, capsys):
    from typer.testing import CliRunner

    from corp.cli import app

    assert not (tiny_dir / "README.md").exists()
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(tiny_dir),
            "--task",
            "arith",
            "--n-test",
            "2",
            "--pass-k",
            "",
            "--max-completion-length",
            "2",
            "--output-dir",
            str(tmp_path / "ev"),
        ],
    )
    assert res.exit_code == 0, res.output
    notes = [line for line in (res.output + capsys.readouterr().err).splitlines() if "has no model card" in line]
    assert len(notes) == 1 and str(tiny_dir) in notes[0], notes


def test_the_cards_corp_eval_line_reproduces_its_row(tiny_dir, runs_root, monkeypatch, tmp_path):
    """The `corp eval` line of a card, run as written (through the CLI, in the model directory), gives
    the accuracy the card states for the model's row, from the same completions the run scored."""
    import re
    import shlex

    from typer.testing import CliRunner

    from corp.cli import app

    run_dir = smoke_run("consolidate", tiny_dir, runs_root)["run_dir"]
    text = (run_dir / "model" / "README.md").read_text()
    stated = re.search(r"Their test accuracy is row `([^`]+)` of the results below: ([0-9.]+)", text)
    assert stated and stated.group(1) == "corp", text
    line = next(ln for ln in text.splitlines() if ln.startswith("corp eval "))
    monkeypatch.chdir(run_dir / "model")
    res = CliRunner().invoke(app, [*shlex.split(line)[1:], "--output-dir", str(tmp_path / "ev")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert f"{report['greedy_accuracy']:.3f}" == stated.group(2)
    # accuracy is 0 for a random model; the rewards (a checksum of the text) say the completions are the run's
    ran = [json.loads(x) for x in (run_dir / "evals.jsonl").read_text().splitlines()]
    deployed = next(r for r in ran if r["split"] == "test" and r["kind"] == "direction")
    again = [json.loads(x) for x in (tmp_path / "ev" / "evals.jsonl").read_text().splitlines()]
    assert [r["rewards"] for r in again if r["split"] == "test"] == [deployed["rewards"]]
    assert len(set(deployed["rewards"])) > 1


def test_card_says_when_the_gate_abstained_and_names_lm_eval_only_where_it_has_the_task(tmp_path):
    from corp.cards import build_card

    def card(task, accepted):
        recipe = {"kind": "corp-direction", "components": [], "made_by": {"method": "corp", "accepted": accepted}}
        report = {
            "task": task,
            "n_test": 2,
            "rows": [{"method": "base", "accuracy": 0.5}, {"method": "corp", "accuracy": 0.5}],
        }
        return build_card(
            tmp_path / "model",
            method="consolidate",
            base={"model": "Qwen/Qwen2.5-0.5B-Instruct"},
            task=task,
            recipe=recipe,
            report=report,
            labelled={"support": 2},
            config={"task": task, "n_test": 2, "split_seed": 3, "model": str(tmp_path / "elsewhere" / "base")},
            made_by="test",
        )

    first = card("gsm8k:mode=strict", False).split("\n# ", 1)[1].split("\n")[2]
    assert "base model's weights, unchanged" in first and "abstained" in first
    assert "consolidated" in card("gsm8k", True).split("\n# ", 1)[1].split("\n")[2]
    text = card("gsm8k:mode=strict", True)
    assert "--tasks gsm8k " in text and "corp eval --model . --task gsm8k:mode=strict --n-test 2 --split-seed 3" in text
    assert "--tasks minerva_math500" in card("math500", True) and "--confirm_run_unsafe_code" in card("mbpp", True)
    assert "lm_eval" not in card("arith", True) and str(tmp_path) not in card("arith", True)
