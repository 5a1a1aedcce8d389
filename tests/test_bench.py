"""`corp bench` (issue 13): matched-budget rules on hand-made ledgers, a tiny sweep over the registry
(outputs written, resumed without generating, missing methods listed, budgets matched as the
adapters say), bad input as one line before any compute."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from corp.bench.budget import first_crossing, min_budget, next_units, prefix_that_fits
from corp.bench.config import BenchConfig
from corp.config import load_config
from corp.errors import CorpError
from tests.test_methods import count_model_calls

# ----------------------------------------------------------------------------- budget rules (pure)


def test_prefix_that_fits_is_the_largest_prefix_within_the_budget():
    costs = [3.0, 3.0, 5.0, 1.0]
    assert prefix_that_fits(costs, 2.9) == 0
    assert prefix_that_fits(costs, 3.0) == 1  # exactly the budget fits
    assert prefix_that_fits(costs, 10.9) == 2
    # a prefix, never a subset: the cheap 4th specialist does not jump the expensive 3rd
    assert prefix_that_fits(costs, 7.0) == 2
    assert prefix_that_fits(costs, 12.0) == 4
    assert prefix_that_fits(costs, 1e9) == 4


def test_first_crossing_and_growth():
    cumulative = [2.0, 4.0, 6.0, 8.0]
    assert first_crossing(cumulative, 4.0) == 1  # reaching the budget exactly counts
    assert first_crossing(cumulative, 4.1) == 2
    assert first_crossing(cumulative, 9.0) is None
    assert next_units(1, 2.0, 7.0) == 4  # 2 FLOPs per unit so far: 4 units reach 7
    assert next_units(3, 6.0, 6.5) == 4  # always at least one more
    assert next_units(2, 0.0, 5.0) == 3  # nothing measured yet: one more unit
    assert min_budget(1.0, 2, 10, 100, 4) == 2 * 10 * 104 * 2


# ----------------------------------------------------------------------------- the tiny sweep


def _benchmark(name: str):
    """A script of benchmarks/ loaded as a module (they are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_options(tiny_dir: Path, root: Path, **over) -> dict:
    opts = dict(
        name="tiny",
        model=str(tiny_dir),
        tasks=[{"task": "arith", "label": "add"}],
        seeds=[1, 2],
        budgets=[1e8, 2e8],
        population=14,
        sigmas=[0.05],
        n_support=4,
        n_probe=4,
        n_validation=4,
        n_test=6,
        max_new_tokens=4,
        batch_size=8,
        threads=1,
        reward="tests.test_methods:text_checksum",
        results_dir=str(root / "results"),
        work_dir=str(root / "work"),
        methods={
            "self-consistency": {"options": {"k": [1, 2]}},
            # racing (issue 16) as a variant: the same method, compared with full scoring at each budget
            "randopt": {
                "options": {"top_k": [1, 2]},
                "variants": {"randopt": {}, "randopt-raced": {"race": "halving", "race_first": 2}},
            },
            # the gate is forced open: a random model's update would rightly be refused
            "consolidate": {"options": {"alphas": [1, 2], "gate_z": -10.0}, "variants": {"corp-stage1": {"rounds": 0}}},
            "es": {"options": {"population": 2, "sigma": 0.05, "alpha": 0.05}},
            "grpo": {
                "options": {"prompts_per_step": 2, "num_generations": 2, "learning_rate": 1e-3},
                "variants": {"grpo": {"loss": "grpo"}},
            },
            "ftis": {"skip": "run by tests/test_bench_ftis.py"},
        },
        compare=[
            ["corp-stage1", "base"],
            ["corp-stage1", "randopt-top1"],
            ["corp-stage1", "randopt-vote@2"],
            ["corp-stage1", "grpo"],
        ],
    )
    opts.update(over)
    return opts


# every test that takes `swept` is marked slow: the sweep is about a minute, and the first fast test to take it would pay it
@pytest.fixture(scope="module")
def swept(tiny_dir, tmp_path_factory):
    from corp.bench.sweep import run_bench

    root = tmp_path_factory.mktemp("bench")
    cfg = load_config(BenchConfig, None, tiny_options(tiny_dir, root))
    with count_model_calls() as first:
        summary = run_bench(cfg, "corp bench --config tiny.yaml")
    csv_before = (root / "results" / "tiny" / "results.csv").read_text()
    with count_model_calls() as second:
        again = run_bench(load_config(BenchConfig, None, tiny_options(tiny_dir, root)), "corp bench --config tiny.yaml")
    return {
        "root": root,
        "cfg": cfg,
        "summary": summary,
        "again": again,
        "first": dict(first),
        "second": dict(second),
        "csv_before": csv_before,
    }


def _rows(swept) -> list[dict]:
    with open(swept["root"] / "results" / "tiny" / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_sweep_writes_results_table_and_plots(swept):
    out = swept["root"] / "results" / "tiny"
    rows = _rows(swept)
    names = {r["method"] for r in rows}
    assert {
        "base",
        "self-consistency@1",
        "self-consistency@2",
        "randopt-top1",
        "randopt-vote@2",
        "corp-stage1",
        "es",
        "grpo",
    } <= names
    for r in rows:
        assert (
            r["accuracy"] != ""
            and r["labelled_examples"] != ""
            and r["passes_per_example"] != ""
            and r["hyperparameters"]
        )
    for setting in ("paper", "equal-data"):
        for budget in ("1e+08", "2e+08"):
            got = {r["method"] for r in rows if r["setting"] == setting and r["budget"] == budget}
            assert {"randopt-top1", "corp-stage1", "es", "grpo"} <= got, (setting, budget, got)
    # data settings: RandOpt/ES/GRPO see support (4) in paper and support + probe + validation (12) in equal-data;
    # CoRP 12 in both
    lab = {(r["method"], r["setting"]): int(r["labelled_examples"]) for r in rows}
    assert lab[("randopt-top1", "paper")] == 4 and lab[("randopt-top1", "equal-data")] == 12
    assert lab[("es", "paper")] == 4 and lab[("es", "equal-data")] == 12
    assert lab[("corp-stage1", "paper")] == 12 == lab[("corp-stage1", "equal-data")] and lab[("base", "paper")] == 0
    table = (out / "table.md").read_text()
    assert (
        "## add, paper" in table
        and "## Headline: best single model per method (equal-data" in table
        and "corp-stage1 vs randopt-top1" in table
        and "95% interval" in table
        and "FLOPs (a / b)" in table
    )
    assert "matched" in table
    for p in swept["summary"]["plots"]:
        assert (out / p).stat().st_size > 1000
    assert any(p.startswith("accuracy_vs_passes") for p in swept["summary"]["plots"])
    assert all("__add__" in p for p in swept["summary"]["plots"]), "the task's label names its files"
    head = table.split("## Headline")[1].split("\n## ")[0]
    assert "| add | randopt-top1 |" in head and "randopt-vote@2" not in head and "self-consistency@2" not in head
    assert {r["task_label"] for r in rows} == {"add"} and {r["task"] for r in rows} == {"arith"}


@pytest.mark.slow
def test_missing_methods_are_listed_not_skipped(swept, tiny_dir):
    table = (swept["root"] / "results" / "tiny" / "table.md").read_text()
    assert "## Missing methods" in table and "ftis" in table
    assert "ftis" in swept["summary"]["missing"]
    from corp.bench.sweep import plan

    # a method the config leaves out for time is listed with the config's reason, and no cell of it is planned
    cfg = load_config(
        BenchConfig,
        None,
        tiny_options(
            tiny_dir, swept["root"], methods={"randopt": None, "es": {"skip": "left out for time"}}, compare=[]
        ),
    )
    cells, missing = plan(cfg)
    assert {"method": "es", "reason": "not run in this bench: left out for time"} in missing and not any(
        c.method == "es" for c in cells
    )


@pytest.mark.slow
def test_resume_recomputes_nothing(swept):
    assert swept["first"]["generate"] > 0, "the first sweep generated nothing: the resume check would prove nothing"
    assert swept["second"] == {"generate": 0, "forward": 0}, swept["second"]
    assert swept["again"]["method_calls"] == 0 and swept["again"]["reused"] == swept["again"]["cells"]
    assert (swept["root"] / "results" / "tiny" / "results.csv").read_text() == swept["csv_before"]


@pytest.mark.slow
def test_budgets_are_matched_as_the_adapters_say(swept):
    from corp.runtime.runs import read_jsonl

    root = swept["root"]
    prefix_bit = False
    records = [json.loads(p.read_text()) for p in (root / "results" / "tiny" / "cells").glob("*.json")]
    for rec in records:
        if rec["kind"] == "population" and rec["label"] == "randopt":
            # the largest prefix of the shared population whose scoring FLOPs fit; the cell's FLOPs are that prefix's
            pop_dir = Path(rec["population_run"])
            rows = sorted(
                (r for r in read_jsonl(pop_dir / "population.jsonl") if r.get("kind") == "specialist"),
                key=lambda r: r["index"],
            )
            n_params = json.loads((pop_dir / "report.json").read_text())["population"]["selection_ledger"]["n_params"]
            costs = [2.0 * n_params * (r["prompt_tokens"] + r["generated_tokens"]) for r in rows]
            assert rec["units"] == prefix_that_fits(costs, rec["budget"])
            assert rec["budget_reached"] == (rec["units"] < len(costs))
            prefix_bit = prefix_bit or rec["units"] < len(costs)
            assert rec["flops"] == pytest.approx(sum(costs[: rec["units"]])) and rec["flops"] <= rec["budget"]
        if rec["kind"] == "iterative":  # the last checkpoint within the budget, labelled with the model's own count
            assert rec["flops"] <= rec["budget"] and rec["units"] >= 1
            fit = [
                g for g in rec["grown"] if g["flops"] <= rec["budget"]
            ]  # (units the report said, FLOPs) of every growth
            assert fit[-1] == {"units": rec["units"], "flops": rec["flops"]}
            # the budget stopped it (no unit cap here): never "budget not reached" when the rest buys no unit
            assert rec["budget_reached"] is True, rec["grown"]
        if (
            rec["budget"] is not None
        ):  # one rule for every method: never over the budget, CoRP's own evaluations included
            assert rec["flops"] <= rec["budget"], (rec["label"], rec["flops"], rec["budget"])
    assert prefix_bit, "no budget cut the population: the prefix check above proved little"
    # CoRP's own evaluations count: where the prefix scoring alone affords plus them overshot, a smaller prefix was
    # taken
    shrunk = [r for r in records if r["label"] == "corp-stage1" and len(r.get("tried", [])) > 1]
    assert shrunk and all(
        r["tried"][0]["flops"] > r["budget"] >= r["flops"] and r["units"] < r["tried"][0]["units"] for r in shrunk
    )
    # a larger budget never buys less
    by = {}
    for rec in records:
        if rec["budget"] is not None:
            by.setdefault((rec["label"], rec["setting"]), []).append((rec["budget"], rec["units"]))
    for pts in by.values():
        pts.sort()
        assert [u for _, u in pts] == sorted(u for _, u in pts)


@pytest.mark.slow
def test_raced_cells_race_more_specialists_within_the_same_budget(swept):
    records = [json.loads(p.read_text()) for p in (swept["root"] / "results" / "tiny" / "cells").glob("*.json")]
    full = {(r["setting"], r["budget"]): r for r in records if r["label"] == "randopt"}
    raced = [r for r in records if r["label"] == "randopt-raced"]
    assert len(raced) == 8  # 2 seeds x 2 settings x 2 budgets
    for rec in raced:
        plain = full[(rec["setting"], rec["budget"])]
        assert rec["flops"] <= rec["budget"], "a raced cell stays within its budget"
        assert rec["race"]["tried"][0]["units"] == plain["units"], "it starts from what full scoring affords"
        assert rec["units"] >= plain["units"] and rec["race"]["rule"] == "successive halving"
        assert {r["name"] for r in rec["rows"]} == {"randopt-raced:randopt-top1", "randopt-raced:randopt-vote@2"}
    assert any(r["units"] > full[(r["setting"], r["budget"])]["units"] for r in raced), (
        "racing bought no extra specialist anywhere"
    )


@pytest.mark.slow
def test_readme_section_cites_intervals(swept):
    from corp.bench.report import readme_section

    text = readme_section(swept["cfg"])
    assert text.startswith("## Results") and "corp bench --config tiny.yaml" in text and "accuracy_vs_flops" in text
    # the front door gets the headline and the sentences; the per-task tables and protocol stay in table.md
    assert "### Headline: best single model per method" in text and "/table.md)" in text
    assert "Compute and data were matched like this" not in text and "\n## add, paper" not in text
    assert text.count("![") == 1
    for line in text.splitlines():
        if " beats " in line:
            assert "95% CI" in line and "FLOPs" in line, line


@pytest.mark.slow
def test_write_into_fills_the_marked_blocks_and_keeps_everything_else(swept, tmp_path):
    """`corp bench --write-into FILE`: each marked block is replaced by this bench's part, with links that
    resolve from FILE's folder (a doc in docs/ needs ../); the file's own text stays; a second write changes
    nothing; a file with no block, or a block naming an unknown part, is one line and writes nothing."""
    import re

    from corp.bench.report import write_into

    doc = tmp_path / "docs" / "bench.md"
    doc.parent.mkdir()
    own = ["# Mine", "kept above", "kept between", "kept below"]
    doc.write_text(
        f"{own[0]}\n\n{own[1]}\n\n<!-- corp bench readme -->\nstale text\n<!-- /corp bench readme -->\n\n{own[2]}\n"
        f"<!-- corp bench protocol -->\n<!-- /corp bench protocol -->\n{own[3]}\n"
    )
    assert write_into(swept["cfg"], doc) == ["readme", "protocol"]
    text = doc.read_text()
    assert "stale text" not in text and all(line in text.splitlines() for line in own)
    readme = text.split("<!-- corp bench readme -->")[1].split("<!-- /corp bench readme -->")[0]
    assert "### Headline: best single model per method" in readme and "--write-into bench.md" in readme
    assert "### The protocol's tables (tiny)" in text.split("<!-- corp bench protocol -->")[1]
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links and all((doc.parent / link).exists() for link in links), links
    assert any(link.startswith("../") for link in links), "links are relative to the doc's folder"
    write_into(swept["cfg"], doc)
    assert doc.read_text() == text, "a second write changes nothing"
    for body, message in [
        ("no block here\n", "has no block"),
        ("<!-- corp bench x -->\n<!-- /corp bench x -->\n", "unknown"),
    ]:
        bad = tmp_path / "bad.md"
        bad.write_text(body)
        with pytest.raises(CorpError, match=message) as err:
            write_into(swept["cfg"], bad)
        assert "\n" not in str(err.value) and bad.read_text() == body


# ----------------------------------------------------------------------------- bad input, before any compute


@pytest.mark.parametrize(
    "over, message",
    [
        ({"methods": {"no-such-method": None}}, "unknown method 'no-such-method'"),
        ({"budgets": [1e3]}, "too small for every method"),
        # issue 22's bad input: a row that cannot exist, one seed with comparisons, a task label twice, unequal trials
        ({"compare": [["corp-stage1", "randopt-vote@3"]]}, "compare names 'randopt-vote@3'"),
        ({"compare": [["corp", "base"]]}, "compare names 'corp'"),
        ({"seeds": [1]}, "an across-seed interval needs at least 2 seeds"),
        (
            {"tasks": [{"task": "arith", "label": "a"}, {"task": "arith:digits=2", "label": "a"}]},
            "task label 'a' is used twice",
        ),
        (
            {"tasks": [{"task": "arith", "label": "a"}, {"task": "arith:digits=2", "label": "b", "seeds": [1, 9]}]},
            "task b's seeds [1, 9] must be a non-empty subset of seeds [1, 2]",
        ),
        (
            {"tasks": [{"task": "arith", "label": "a"}, {"task": "arith:digits=2", "label": "b", "seeds": [2]}]},
            "an across-seed interval needs at least 2 seeds",
        ),
        (
            {
                "hyperparameters": "search",
                "trials": 2,
                "methods": {
                    "es": {"search": {"alpha": [0.1, 0.2]}},
                    "self-consistency": {"trials": 3, "search": {"temperature": [0.5, 1.0, 1.5]}},
                },
            },
            "asks for 3 trials, the others get trials = 2",
        ),
        ({"n_test": 5000}, "test 5000"),
        ({"methods": {"randopt": {"options": {"no_such_option": 1}}}}, "no-such-option"),
        # issue 23: top_k [5] with a population of 2 ran as top-1 under the row name 'randopt'
        (
            {"population": 2, "methods": {"randopt": {"options": {"top_k": [5]}}}},
            "method 'randopt' (variant 'randopt'): top_k 5 can never fit the bench's population of 2 specialists",
        ),
        ({"population": 4, "methods": {"randopt": {"options": {"top_k": [1, 2, 8]}}}}, "top_k 8 can never fit"),
        # arith's support examples all use "+": one operator group for three clients (found by a real run)
        ({"methods": {"fgrpo": {"options": {"clients": 3, "split_by": "op"}}}}, "gets no support examples"),
        # the hyperparameter search (corp.bench.search)
        ({"hyperparameters": "search"}, "no method has a search space"),
        (
            {"methods": {"es": {"search": {"alpha": [0.1, 0.2]}}}},
            "has a search space but hyperparameters is 'defaults'",
        ),
        (
            {"hyperparameters": "search", "trials": 3, "methods": {"es": {"search": {"alpha": [0.1, 0.2]}}}},
            "2 combination(s), fewer than trials = 3",
        ),
        (
            {
                "hyperparameters": "search",
                "trials": 1,
                "methods": {"es": {"options": {"alpha": 0.1}, "search": {"alpha": [0.1, 0.2]}}},
            },
            "both fixed",
        ),
        (
            {"hyperparameters": "search", "trials": 1, "methods": {"es": {"search": {"no_such_option": [1, 2]}}}},
            "no-such-option",
        ),
    ],
)
def test_bad_input_is_one_error_before_compute(over, message, tiny_dir, tmp_path):
    from corp.bench.sweep import run_bench

    opts = tiny_options(tiny_dir, tmp_path, **over)
    if "methods" in over:
        opts["methods"] = {
            **over["methods"],
            "randopt": {"options": {"top_k": [1], **((over["methods"].get("randopt") or {}).get("options") or {})}},
        }
    with count_model_calls() as calls:
        with pytest.raises(CorpError) as err:
            run_bench(load_config(BenchConfig, None, opts))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert calls["generate"] == 0 and not (tmp_path / "work").exists()


def test_unreadable_results_directory_is_one_error(tiny_dir, tmp_path):
    from corp.bench.sweep import run_bench

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "tiny").write_text("not a directory")
    with pytest.raises(CorpError, match="results directory .* is a file"):
        run_bench(load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path)))
    # a damaged record is named, with what to do (issue 41: "fix its permissions")
    bad = tmp_path / "r2" / "tiny" / "cells"
    bad.mkdir(parents=True)
    (bad / "x.json").write_text("{torn")
    with pytest.raises(CorpError) as err:
        run_bench(load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, results_dir=str(tmp_path / "r2"))))
    assert str(bad / "x.json") in str(err.value) and "move it aside" in str(err.value), err.value
    assert "permissions" not in str(err.value) and "\n" not in str(err.value)


def test_checking_the_results_directory_leaves_another_processs_check_alone(tiny_dir, tmp_path):
    """Two bench processes on one task check the results directory at the same moment: one must not
    remove the other's write-test file (with one shared name, the second process's check failed with
    'cannot be read or written' while the first had removed its file)."""
    from corp.bench.preflight import check_results_dir

    cfg = load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path))
    out = check_results_dir(cfg)
    theirs = out / ".corp-bench-write-test"  # the other process's file, between its write and its removal
    theirs.write_text("ok")
    assert check_results_dir(cfg) == out
    assert theirs.read_text() == "ok" and sorted(p.name for p in out.iterdir()) == [".corp-bench-write-test", "cells"]


def test_cli_bad_config_is_one_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("name: x\nmethods: {randopt: null}\nbudgets: [-1]\n")
    p = subprocess.run(
        [sys.executable, "-m", "corp.cli", "bench", "--config", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            "CORP_NO_PROGRESS": "1",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        },
    )
    assert (
        p.returncode == 2
        and p.stderr.strip().count("\n") == 0
        and p.stderr.startswith("error: bench config: budgets must be > 0")
    ), p.stderr


@pytest.mark.slow
def test_report_only_runs_nothing_and_says_what_is_missing(swept, tiny_dir):
    from corp.bench.sweep import run_bench

    # one more budget: its cells are not run, and the table says the bench is incomplete
    opts = tiny_options(tiny_dir, swept["root"], budgets=[1e8, 2e8, 4e8])
    with count_model_calls() as calls:
        summary = run_bench(load_config(BenchConfig, None, opts), "corp bench --report-only", compute=False)
    assert calls == {"generate": 0, "forward": 0} and summary["method_calls"] == 0
    assert (
        summary["not_run"] == 20
    )  # randopt, randopt-raced, corp-stage1, es, grpo x 2 settings x 2 seeds at the new budget
    assert "Incomplete: 20 of" in (swept["root"] / "results" / "tiny" / "table.md").read_text()
    # one more seed, not run: a cell with fewer seeds than configured says so instead of "± 0.000"
    run_bench(
        load_config(BenchConfig, None, tiny_options(tiny_dir, swept["root"], seeds=[1, 2, 3])),
        "corp bench --report-only",
        compute=False,
    )
    table = (swept["root"] / "results" / "tiny" / "table.md").read_text()
    assert "(2 of 3 seeds, sd" in table and "± 0.000" not in table
    # a compare pair that names no row is said in the table, not dropped silently
    # a compare pair that names no row any method can report is one error line, before anything is written
    with pytest.raises(CorpError, match="compare names 'randopt-vote@9', a row no method"):
        run_bench(
            load_config(
                BenchConfig, None, tiny_options(tiny_dir, swept["root"], compare=[["corp-stage1", "randopt-vote@9"]])
            ),
            "corp bench --report-only",
            compute=False,
        )
    run_bench(
        load_config(BenchConfig, None, tiny_options(tiny_dir, swept["root"])), "corp bench --report-only", compute=False
    )  # as it was


def test_fgrpo_joins_the_bench_through_its_adapter(tiny_dir, tmp_path):
    """A multi-party method named on the registry with an adapter runs at each budget like GRPO:
    its rounds grow until its clients' ledger reaches the budget, and a rerun computes nothing."""
    from corp.bench.sweep import run_bench

    over = dict(
        budgets=[1e8, 2e8],
        settings=["paper"],
        compare=[],
        seeds=[1],
        methods={
            "fgrpo": {
                "options": {
                    "clients": 2,
                    "split_by": "iid",
                    "steps": 1,
                    "prompts_per_step": 2,
                    "num_generations": 2,
                    "lora_r": 2,
                    "learning_rate": 1e-3,
                }
            }
        },
    )
    summary = run_bench(
        load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), "corp bench --config fgrpo.yaml"
    )
    assert "fgrpo" not in summary["missing"]
    records = [json.loads(p.read_text()) for p in (tmp_path / "results" / "tiny" / "cells").glob("*.json")]
    fg = sorted((r for r in records if r["method"] == "fgrpo"), key=lambda r: r["budget"])
    assert [r["budget"] for r in fg] == [1e8, 2e8]
    for rec in fg:
        assert rec["kind"] == "iterative" and rec["units"] >= 1 and rec["flops"] <= rec["budget"]
    assert fg[0]["units"] <= fg[1]["units"]
    with count_model_calls() as again:
        run_bench(
            load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), "corp bench --config fgrpo.yaml"
        )
    assert sum(again.values()) == 0


def test_fera_joins_the_bench_as_a_training_free_method(tiny_dir, tmp_path):
    """FERA trains nothing: one cell per seed serves every budget, its per-round rows reach the
    table with their passes per example, and a rerun computes nothing."""
    from corp.bench.sweep import run_bench

    over = dict(
        budgets=[1e8],
        settings=["paper"],
        compare=[],
        seeds=[1],
        methods={"fera": {"options": {"clients": 2, "shots": 1, "rounds": 2, "samples": 2}}},
    )
    summary = run_bench(
        load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), "corp bench --config fera.yaml"
    )
    assert "fera" not in summary["missing"]
    rows = list(csv.DictReader(open(tmp_path / "results" / "tiny" / "results.csv")))
    names = {r["method"] for r in rows}
    assert {"fera-round1", "fera-round2", "plain-vote-round1"} <= names, names
    assert all(int(r["passes_per_example"]) >= 2 for r in rows if r["method"].startswith("fera-round"))
    with count_model_calls() as again:
        run_bench(
            load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), "corp bench --config fera.yaml"
        )
    assert sum(again.values()) == 0


# ----------------------------------------------------------------------------- hyperparameter search


def test_choose_takes_the_best_mean_validation_accuracy_and_the_earlier_of_ties():
    from corp.bench.search import choose, grid, trial_options

    def rec(*accs):
        return {"rows": [{"accuracy": a} for a in accs]}

    assert choose([rec(0.2, 0.4), rec(0.5, 0.0), rec(0.1, 0.7)]) == 2  # means 0.30, 0.25, 0.40
    assert choose([rec(0.5), rec(0.5), rec(0.25)]) == 0
    assert choose([{"rows": []}, rec(0.0)]) == 1 and choose([{"rows": []}]) is None
    space = {"b": [1, 2, 3], "a": [0.1, 0.2]}
    assert len(grid(space)) == 6 and grid(space)[0] == {"a": 0.1, "b": 1}
    drawn = trial_options("es", "es", space, 4)
    assert len({json.dumps(d, sort_keys=True) for d in drawn}) == 4 and drawn == trial_options("es", "es", space, 4)


SEARCH = dict(
    hyperparameters="search",
    trials=2,
    budgets=[1e8],
    compare=[],
    seeds=[1],
    methods={
        "self-consistency": {"options": {"k": [1, 2]}, "search": {"temperature": [0.5, 1.0]}},
        "randopt": {"options": {"top_k": [1]}},
        "es": {"options": {"population": 2, "sigma": 0.05}, "search": {"alpha": [0.01, 0.05, 0.5]}},
    },
)


@pytest.fixture(scope="module")
def searched(tiny_dir, tmp_path_factory):
    from corp.bench.sweep import run_bench

    root = tmp_path_factory.mktemp("search")
    summary = run_bench(
        load_config(BenchConfig, None, tiny_options(tiny_dir, root, **SEARCH)), "corp bench --config search.yaml"
    )
    with count_model_calls() as again:
        resumed = run_bench(
            load_config(BenchConfig, None, tiny_options(tiny_dir, root, **SEARCH)), "corp bench --config search.yaml"
        )
    return {"root": root, "summary": summary, "again": dict(again), "resumed": resumed}


def _records(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / "results" / "tiny" / "cells").glob("*.json"))]


@pytest.mark.slow
def test_search_trials_are_scored_on_validation_and_never_on_test(searched, tiny_dir):
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits

    splits = make_splits(get_task("arith"), SplitSizes(4, 4, 4, 6), 0)
    validation, test = [e.id for e in splits["validation"]], {e.id for e in splits["test"]}
    trials = [r for r in _records(searched["root"]) if r["setting"] == "tune"]
    assert sorted((r["label"], r["trial"]) for r in trials) == [
        ("es", 0),
        ("es", 1),
        ("self-consistency", 0),
        ("self-consistency", 1),
    ]
    for rec in trials:
        assert rec["example_ids"] == validation and not test & set(rec["example_ids"]), rec["label"]
        assert rec["seed"] == 1 and rec["hyperparameters"]["report_on"] == "validation"
        assert json.loads((Path(rec["run_dir"]) / "splits.json").read_text())["report_on"] == "validation"
    rows = list(csv.DictReader(open(searched["root"] / "results" / "tiny" / "tuning.csv")))
    assert len(rows) == 2 + 2 * 3 and all(
        r["validation_accuracy"] != "" for r in rows
    )  # ES 2 trials; SC 2 trials x (base, sc@1, sc@2)
    assert "Hyperparameters: search" in (searched["root"] / "results" / "tiny" / "table.md").read_text()
    assert searched["again"] == {"generate": 0, "forward": 0} and searched["resumed"]["method_calls"] == 0


@pytest.mark.slow
def test_every_seed_and_setting_uses_the_trial_best_on_validation(searched):
    from corp.bench.search import choose
    from corp.grids import edge_flag

    records = _records(searched["root"])
    assert any(r["label"] == "self-consistency" and r["setting"] != "tune" for r in records)
    for label, option in (("es", "alpha"), ("self-consistency", "temperature")):
        trials = sorted(
            (r for r in records if r["setting"] == "tune" and r["label"] == label), key=lambda r: r["trial"]
        )
        best = trials[choose(trials)]["hyperparameters"][option]
        finals = [r for r in records if r["setting"] != "tune" and r["label"] == label]
        assert {r["setting"] for r in finals} == {"paper", "equal-data"}
        for rec in finals:
            assert rec["hyperparameters"][option] == best and "report_on" not in rec["hyperparameters"]
            assert rec["tuning"]["chosen"] == {option: best} and rec["tuning"]["trials"] == 2
            assert not set(rec["example_ids"]) & set(trials[0]["example_ids"]), "final cells report on test"
            # a tuned value on its search grid's edge reaches the final run's report (and card): a run cannot
            # see the bench's search (SC's two temperatures: always an edge; ES: when its alpha is one)
            grid = SEARCH["methods"][label]["search"][option]
            flags = json.loads((Path(rec["run_dir"]) / "report.json").read_text()).get("edge_flags") or []
            flag = edge_flag(option, best, grid)
            assert [f for f in flags if f.get("by")] == ([{**flag, "by": "corp bench's tuning"}] if flag else [])
            assert not any(f.get("by") for f in (rec.get("detail") or {}).get("edge_flags") or []), "tuning says it"
            card = Path(rec["run_dir"]) / "model" / "README.md"
            if flag and card.exists():
                assert "by corp bench's tuning" in card.read_text()
    randopt = [r for r in records if r["label"] == "randopt"]
    assert randopt and all("tuning" not in r for r in randopt) and not any(r["setting"] == "tune" for r in randopt)


@pytest.mark.slow
def test_the_choice_follows_the_validation_records(searched, tiny_dir):
    """Planted: the losing ES trial's validation record is made the winner; the final ES cells then
    resolve to the other alpha, whose cells have not run (report-only computes nothing)."""
    from corp.bench.search import choose
    from corp.bench.sweep import run_bench

    cells = searched["root"] / "results" / "tiny" / "cells"
    paths = sorted(p for p in cells.glob("*__tune__*") if json.loads(p.read_text())["label"] == "es")
    trials = [(json.loads(p.read_text()), p) for p in paths]
    trials.sort(key=lambda t: t[0]["trial"])
    loser = 1 - choose([t[0] for t in trials])
    saved = trials[loser][1].read_text()
    rec = json.loads(saved)
    for row in rec["rows"]:
        row["accuracy"] = 2.0  # above any real accuracy
    trials[loser][1].write_text(json.dumps(rec))
    try:
        with count_model_calls() as calls:
            summary = run_bench(
                load_config(BenchConfig, None, tiny_options(tiny_dir, searched["root"], **SEARCH)),
                "report",
                compute=False,
            )
        assert calls == {"generate": 0, "forward": 0}
        assert summary["not_run"] == 2  # ES at 1e8 in paper and equal-data, now with the other alpha
    finally:
        trials[loser][1].write_text(saved)
        run_bench(
            load_config(BenchConfig, None, tiny_options(tiny_dir, searched["root"], **SEARCH)), "report", compute=False
        )


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p)
        for pattern in ("bench-*.yaml", "size-claim/*.yaml", "noise-claim/*.yaml")
        for p in (Path(__file__).resolve().parents[1] / "configs").glob(pattern)
    ),
)
def test_every_shipped_bench_config_loads_and_plans(path):
    """The configs in configs/ (the GPU one is not run here) are valid: fields, methods, search spaces."""
    from corp.bench.sweep import load_bench_config, plan

    cfg = load_bench_config(path)
    cells, missing = plan(cfg)
    assert cells and all(c.method in cfg.methods for c in cells)
    if cfg.hyperparameters == "search":
        assert any(c.setting == "tune" for c in cells) and any(c.searched for c in cells)


def test_a_clipped_top_k_keeps_its_row_names(tmp_path):
    """Planted (found in the CPU bench's equal-data setting): a budget that buys 2 specialists clips
    RandOpt's top_k [1, 3] to [1], so its report has one row; it must stay "randopt-top1" (the
    table's row for that method), not take the cell's label "randopt". CoRP's single row still
    takes its variant's label."""
    from corp.bench.sweep import Bench, Cell

    cfg = load_config(BenchConfig, None, {"methods": {"randopt": None}, "results_dir": str(tmp_path)})
    row = {
        "accuracy": 0.5,
        "passes_per_example": 1,
        "labelled_examples": 4,
        "ledger": {"prompt_tokens": 1, "generated_tokens": 1, "flops": 2.0},
    }
    bench = Bench(cfg)
    rec = bench._record(
        Cell("arith", "paper", 0, "randopt", "randopt", 1e9, {"top_k": [1, 3]}),
        {"rows": [{**row, "method": "randopt-top1"}]},
        tmp_path,
        1.0,
        2,
    )
    assert [r["name"] for r in rec["rows"]] == ["randopt-top1"]
    rec = bench._record(
        Cell("arith", "paper", 0, "consolidate", "corp-stage1", 1e9, {"top_k": [1]}),
        {"rows": [{**row, "method": "corp"}]},
        tmp_path,
        1.0,
        2,
    )
    assert [r["name"] for r in rec["rows"]] == ["corp-stage1"]


def test_a_budget_that_buys_fewer_specialists_than_top_k_does_not_fit(tmp_path, monkeypatch):
    """A top_k that fits the population but not a budget's prefix: the cell is 'does not fit' (the bench
    protocol's rule), with nothing run, never a top-1 row under the cell's name; a top_k list with a value
    that fits runs (its larger values clipped)."""
    from corp.bench.sweep import Bench, Cell

    cfg = load_config(
        BenchConfig, None, {"methods": {"randopt": None}, "results_dir": str(tmp_path), "work_dir": str(tmp_path / "w")}
    )
    bench = Bench(cfg)
    pop = {"run_dir": "pop", "scales": [1e-3], "costs": [1.0] * 8, "seconds": [0.0] * 8, "wall": 0.0}
    monkeypatch.setattr(bench, "population", lambda cell: pop)
    ran = []
    monkeypatch.setattr(bench, "_invoke", lambda method, opts: ran.append(opts) or ({}, 0.0))
    rec = bench._population_cell(Cell("arith", "paper", 0, "randopt", "randopt", 3.0, {"top_k": [5]}))  # buys 3
    assert rec["status"] == "does not fit" and rec["reason"] == "budget buys 3 specialist(s); randopt needs at least 5"
    assert not ran and rec["rows"] == []
    monkeypatch.setattr(bench, "_record", lambda cell, report, run_dir, wall, units, chosen: {"units": units})
    monkeypatch.setattr("corp.bench.cells.get_path", lambda report, path: 0.0)
    rec = bench._population_cell(Cell("arith", "paper", 0, "randopt", "randopt", 3.0, {"top_k": [1, 5]}))
    assert rec["units"] == 3 and ran[-1]["top_k"] == [1]


def test_population_options_come_from_population_config():
    """The options a cell passes to its shared `corp score` run are PopulationConfig's fields less
    the scoring/placement ones; they are also the population's cache key, so a change to this set
    (a new config field) is one decision made here, not a silent change of every key."""
    import dataclasses

    from corp.bench.plan import POPULATION_OPTIONS
    from corp.config import PopulationConfig

    assert POPULATION_OPTIONS <= {f.name for f in dataclasses.fields(PopulationConfig)}
    # the noise scheme defines the population (a cell's key has it only when the cell sets it)
    assert POPULATION_OPTIONS == {
        "model",
        "task",
        "seed",
        "split_seed",
        "backend",
        "device",
        "batch_size",
        "threads",
        "max_new_tokens",
        "reward",
        "data",
        "dtype",
        "n_support",
        "n_probe",
        "n_validation",
        "n_test",
        "sigmas",
        "include",
        "exclude",
        "noise",
    }


def test_unit_costs_read_unset_options_from_the_methods_defaults():
    from corp.algorithms.grpo import GRPOConfig
    from corp.methods import get_method
    from corp.methods.es import ESConfig
    from corp.methods.fgrpo import FGRPOConfig

    ES, GRPO, FGRPO = (get_method(n).bench for n in ("es", "grpo", "fgrpo"))

    es, grpo, fgrpo = ESConfig(), GRPOConfig(), FGRPOConfig()
    assert ES.unit_evals({}) == es.population + 1.0
    assert GRPO.unit_evals({}) == grpo.prompts_per_step * grpo.num_generations / grpo.n_support
    assert (
        FGRPO.unit_evals({})
        == fgrpo.clients * fgrpo.steps * fgrpo.prompts_per_step * fgrpo.num_generations / fgrpo.n_support
    )


@pytest.mark.slow
def test_a_run_trained_past_the_budget_is_never_labelled_as_a_smaller_one(swept, tiny_dir):
    """Planted: the shared GRPO run of the sweep's seed was trained for the larger budget; a bench
    with only the smaller budget (its records gone, the run directories kept, as after a process
    stopped before writing its record) must not take that model under the smaller label (the CPU
    bench's letter-counting record said 2 steps and held the 6-step model)."""
    from corp.bench.sweep import run_bench

    root = swept["root"]
    old = {
        (r["setting"], r["seed"]): r
        for r in (json.loads(p.read_text()) for p in (root / "results" / "tiny" / "cells").glob("*.json"))
        if r["label"] == "grpo" and r["budget"] == 2e8
    }
    opts = tiny_options(
        tiny_dir,
        root,
        budgets=[1e8],
        results_dir=str(root / "results-again"),
        settings=["paper"],
        seeds=[1, 2],
        methods={"grpo": tiny_options(tiny_dir, root)["methods"]["grpo"]},
        compare=[],
    )
    run_bench(load_config(BenchConfig, None, opts))
    recs = [json.loads(p.read_text()) for p in (root / "results-again" / "tiny" / "cells").glob("*.json")]
    assert len(recs) == 2
    for rec in recs:
        ahead = old[("paper", rec["seed"])]
        first = rec["grown"][0]  # the shared run, as its report said: trained past 1e8 (planted)
        assert first["flops"] > 1e8 and first["units"] >= ahead["units"] > 1, (first, ahead["units"])
        assert rec["rows"] and rec["flops"] <= 1e8 and rec["run_dir"] != ahead["run_dir"], "took the shared run's model"
        fit = [g for g in rec["grown"][1:] if g["flops"] <= 1e8]
        assert fit[-1] == {"units": rec["units"], "flops": rec["flops"]}


def test_the_second_cpu_bench_is_in_the_issue_s_regime_by_its_estimate():
    """configs/bench-cpu-2.yaml, by benchmarks/bench_plan.py's estimate (ledger FLOPs, rates measured on
    the first edition): at the top budget GRPO takes >= 30 optimizer steps and CoRP >= 64 specialists
    beside probe and validation splits of >= 64, 5 seeds, equal trials, and the whole run within about
    9 hours of the 2-core machine by the estimate: at most 18 thread-hours over its tasks (sized to
    about 8 h; with the rates measured on this run's trials, ES 1.7e10 and GRPO 3.4e10 FLOP/s wall,
    arith estimates 10.1 h and letters 7.3 h; bench processes share a task's cells, so the two cores
    split the total, not one task each). The run is measured, not assumed, and what was cut is in the
    config's header."""
    root = Path(__file__).resolve().parents[1]
    mod = _benchmark("bench_plan")
    est = mod.estimate(str(root / "configs" / "bench-cpu-2.yaml"), 3.0)
    cfg = load_config(BenchConfig, str(root / "configs" / "bench-cpu-2.yaml"), {})
    assert len(cfg.seeds) >= 5 and cfg.n_probe >= 64 and cfg.n_validation >= 64 and cfg.n_test >= 300
    grpo = next(v for k, v in est["regime"].items() if k.startswith("grpo"))
    corp = est["regime"]["corp-stage1"]
    assert int(grpo.split("about ")[1].split(" ")[0]) >= 30, grpo
    assert int(corp.split(" ")[0]) >= 64, corp
    assert sum(est["per_task"].values()) <= 18.0 * 3600, est["per_task"]
    assert {m["method"] for m in est["missing"]} >= {"ftis"}


def test_the_shared_population_scores_only_what_the_largest_budget_buys(tiny_dir, tmp_path):
    """population: 40, but the largest budget buys a handful of specialists: the shared population
    stops just past that budget (it grows on resume), instead of scoring all 40."""
    from corp.bench.sweep import run_bench
    from corp.runtime.runs import read_jsonl

    opts = tiny_options(
        tiny_dir,
        tmp_path,
        population=40,
        budgets=[3e7],
        seeds=[1],
        settings=["paper"],
        compare=[],
        methods={"randopt": {"options": {"top_k": [1]}}},
    )
    run_bench(load_config(BenchConfig, None, opts))
    rec = next(json.loads(p.read_text()) for p in (tmp_path / "results" / "tiny" / "cells").glob("*.json"))
    pop_dir = Path(rec["population_run"])
    rows = [r for r in read_jsonl(pop_dir / "population.jsonl") if r.get("kind") == "specialist"]
    n_params = json.loads((pop_dir / "report.json").read_text())["population"]["selection_ledger"]["n_params"]
    costs = [
        2.0 * n_params * (r["prompt_tokens"] + r["generated_tokens"]) for r in sorted(rows, key=lambda r: r["index"])
    ]
    assert rec["units"] >= 1 and len(costs) < 40, len(costs)
    assert sum(costs) > 3e7 and rec["units"] == prefix_that_fits(costs, 3e7) < len(costs)


def test_a_record_of_an_older_bench_protocol_is_never_reused(tiny_dir, tmp_path):
    """Planted: a first-edition record (no bench_protocol, format 1, under the first edition's name) with an accuracy no model here reaches. The bench ignores both, keeps
    them as they are, computes its own cell beside them, and says so; a record of this protocol
    (an interrupted bench) is reused; --report-only over old records only is one error line."""
    import hashlib

    from corp.bench.sweep import Bench, plan, run_bench

    opts = tiny_options(
        tiny_dir,
        tmp_path,
        seeds=[1, 2],
        settings=["paper"],
        compare=[],
        methods={"self-consistency": {"options": {"k": [1]}}},
    )
    cfg = load_config(BenchConfig, None, opts)
    (cell,) = [c for c in plan(cfg)[0] if c.seed == 1]
    bench = Bench(cfg)
    # the first edition's record key: the options without the protocol
    ident = {
        "method": cell.method,
        **{k: v for k, v in cell.opts.items() if k not in ("run_dir", "threads", "from_run", "eval_cache")},
    }
    first_key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:10]
    old = {
        "format": 1,
        "task": cell.task,
        "setting": cell.setting,
        "seed": 1,
        "method": cell.method,
        "label": cell.label,
        "budget": None,
        "kind": "fixed",
        "status": "done",
        "rows": [
            {
                "name": "base",
                "report_row": "base",
                "accuracy": 0.987,
                "passes_per_example": 1,
                "labelled_examples": 0,
                "test_tokens": 1,
                "test_flops": 1.0,
                "correct": None,
            }
        ],
        "flops": 0.0,
        "units": None,
        "wall_seconds": 1.0,
        "hyperparameters": {},
    }
    cells_dir = tmp_path / "results" / "tiny" / "cells"
    cells_dir.mkdir(parents=True)
    old_name = bench.record_path(cell).name.rsplit("__", 1)[0] + f"__{first_key}.json"
    planted = [cells_dir / old_name, bench.record_path(cell)]
    assert planted[0] != planted[1], "the protocol is not in the record's name"
    planted[0].write_text(json.dumps(old))
    with pytest.raises(
        CorpError, match="older bench protocol .*none of protocol 2"
    ):  # nothing to report but the old edition
        run_bench(cfg, "corp bench --report-only", compute=False)
    assert not (tmp_path / "results" / "tiny" / "table.md").exists(), (
        "report-only wrote an empty report over the old records"
    )
    with count_model_calls() as calls:
        summary = run_bench(
            load_config(BenchConfig, None, {**opts, "seeds": [1]}), "corp bench"
        )  # stopped after seed 1
    assert calls["generate"] > 0 and summary["method_calls"] == 1 and summary["reused"] == 0, (
        "an old-protocol record was reused"
    )
    assert json.loads(planted[0].read_text()) == old, "the old record was changed"
    rec = json.loads(bench.record_path(cell).read_text())
    assert rec["bench_protocol"] == 2 and rec["rows"][0]["accuracy"] != 0.987
    assert "older bench protocol are kept in cells/" in (tmp_path / "results" / "tiny" / "table.md").read_text()
    with count_model_calls() as calls:
        resumed = run_bench(cfg, "corp bench")  # the interrupted bench resumes: seed 1 reused, seed 2 computed
    assert resumed["reused"] == 1 and resumed["method_calls"] == 1
    assert json.loads((tmp_path / "results" / "tiny" / "bench.json").read_text())["older_protocol_records"] == 1


def test_the_second_cpu_bench_s_grpo_search_tries_the_regime_where_grpo_works():
    """configs/bench-cpu-2.yaml: the search's fixed draw gives GRPO LoRA at lr 5e-5 (this project's
    single GRPO run, LoRA r16 at 5e-5, took arith from 0.141 to 0.508) and a full-parameter trial,
    with the same number of trials for every searched method (the 2-trial draw of the first grid
    was lr 1e-5 only)."""
    from corp.bench.sweep import plan

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(BenchConfig, str(root / "configs" / "bench-cpu-2.yaml"), {})
    tune = [
        c
        for c in plan(cfg)[0]
        if c.setting == "tune" and c.task == cfg.tasks[0] and c.budget in (None, cfg.budgets[-1])
    ]
    drawn = {(float(c.opts["learning_rate"]), int(c.opts["lora_r"])) for c in tune if c.method == "grpo"}
    assert (5e-5, 16) in drawn and any(r == 0 for _, r in drawn), drawn
    per_method = {m: sum(c.method == m for c in tune) for m in {c.method for c in tune}}
    assert len(set(per_method.values())) == 1 and cfg.trials >= 3, per_method


def test_the_bench_table_states_the_ledger_s_lora_convention(tmp_path):
    """The FLOPs note of table.md (and so of the README section) says how LoRA training is charged:
    6 N per trained token, an overcharge, so a conservative charge against GRPO-LoRA."""
    from corp.bench.report import table_md

    cfg = load_config(BenchConfig, None, {"methods": {"self-consistency": None}, "results_dir": str(tmp_path)})
    text = table_md(cfg, [], [], [], "corp bench")
    assert "6 * N_params * trained_tokens" in text and "LoRA training is charged 6 N per trained token" in text
    assert "conservative charge against GRPO-LoRA" in text


def test_bench_cell_options_are_the_method_configs_fields():
    """BenchConfig does not restate RunConfig's and PopulationConfig's fields: the options every cell and the
    shared population get have their types, defaults (but a larger test split and population) and docstrings."""
    import dataclasses
    import typing

    from corp.bench.config import POPULATION_OPTIONS, RUN_OPTIONS
    from corp.config import PopulationConfig, RunConfig, field_docs

    bench_hints, bench_docs = typing.get_type_hints(BenchConfig), field_docs(BenchConfig)
    bench_defaults = {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(BenchConfig)
    }
    for source, names in ((RunConfig, RUN_OPTIONS), (PopulationConfig, POPULATION_OPTIONS)):
        hints, docs, ref = typing.get_type_hints(source), field_docs(source), source()
        for name in names:
            assert bench_hints[name] == hints[name], name
            # the bench's sigmas are fixed, the paper grid by default (its sigma trials are planned on them): not auto
            own = {"n_test": 500, "population": 64, "sigmas": "5e-4,1e-3,2e-3"}
            assert bench_defaults[name] == own.get(name, getattr(ref, name)), name
            assert bench_docs[name] and bench_docs[name] == docs[name] or name in own, name
    assert set(RUN_OPTIONS) < set(bench_hints) and set(POPULATION_OPTIONS) < set(bench_hints)


def test_committed_bench_configs_load():
    """Every bench config of the repository loads (task entries with labels included)."""
    from corp.bench.sweep import load_bench_config

    paths = sorted((Path(__file__).parent.parent / "configs").glob("bench*.yaml"))
    assert paths
    for p in paths:
        cfg = load_bench_config(str(p))
        assert cfg.tasks and all(isinstance(t, str) for t in cfg.tasks)


def test_a_randopt_sigma_trial_takes_its_scales_from_the_one_shared_population(tiny_dir, tmp_path):
    """`search: {from_sigmas: ...}` (RandOpt's sigma search): every trial reads the same shared
    population (which mixes the bench's sigmas) and takes only the specialists of its scales, in
    population order; its FLOPs are those specialists' scoring FLOPs, so a one-scale trial at a
    budget uses as many specialists as the mix would. A bug that passed the filter to the shared
    population would score one population per trial; one that ignored it would vote with
    specialists of the other scale; one that capped the shared population at `population` would
    give a one-scale trial fewer specialists than the mix at the same budget."""
    from corp.bench.sweep import run_bench
    from corp.runtime.runs import read_jsonl

    opts = tiny_options(
        tiny_dir,
        tmp_path,
        population=12,
        sigmas=[0.05, 0.1],
        budgets=[8.5e7],  # buys 8 specialists: more than the 6 of one scale among the first 12
        seeds=[1],
        settings=["paper"],
        compare=[],
        hyperparameters="search",
        trials=3,
        methods={"randopt": {"options": {"top_k": [1, 2]}, "search": {"from_sigmas": [[0.05], [0.1], [0.05, 0.1]]}}},
    )
    run_bench(load_config(BenchConfig, None, opts))
    recs = [json.loads(p.read_text()) for p in sorted((tmp_path / "results" / "tiny" / "cells").glob("*.json"))]
    trials = [r for r in recs if r["setting"] == "tune"]
    assert len(trials) == 3 and all(r["units"] for r in trials), [(r.get("units"), r.get("why")) for r in trials]
    pops = {r["population_run"] for r in trials}
    assert len(pops) == 1, pops  # one shared population for every trial
    pop_dir = Path(pops.pop())
    # the final cell reads a population of exactly the scales its search chose (the mix: the trials' one)
    (final,) = [r for r in recs if r["setting"] != "tune"]
    chosen = final["hyperparameters"]["from_sigmas"]
    assert final["population_sigmas"] == chosen
    final_rows = [
        r for r in read_jsonl(Path(final["population_run"]) / "population.jsonl") if r.get("kind") == "specialist"
    ]
    assert {r["sigma"] for r in final_rows} == set(chosen)
    assert (Path(final["population_run"]) == pop_dir) == (len(chosen) == 2)
    rows = sorted(
        (r for r in read_jsonl(pop_dir / "population.jsonl") if r.get("kind") == "specialist"), key=lambda r: r["index"]
    )
    assert {r["sigma"] for r in rows} == {0.05, 0.1}
    n_params = json.loads((pop_dir / "report.json").read_text())["population"]["selection_ledger"]["n_params"]
    differs = []
    for rec in trials:
        scales = rec["hyperparameters"]["from_sigmas"]
        mine = [r for r in rows if r["sigma"] in scales]
        costs = [2.0 * n_params * (r["prompt_tokens"] + r["generated_tokens"]) for r in mine]
        assert rec["units"] == prefix_that_fits(costs, 8.5e7) > 12 // 2, (scales, rec["units"])
        assert rec["flops"] == pytest.approx(sum(costs[: rec["units"]]))
        report = json.loads((Path(rec["run_dir"]) / "report.json").read_text())
        source = report["population"]["source"]
        assert source["used"] == rec["units"]
        taken = mine[: rec["units"]]
        best, median = report["population"]["reward_best"], report["population"]["reward_median"]
        assert (best, median) == (
            max(r["reward"] for r in taken),
            sorted(r["reward"] for r in taken)[len(taken) // 2],
        )
        if len(scales) == 1:
            assert source["from_sigmas"] == scales
            unfiltered = rows[: rec["units"]]
            differs.append(
                (best, median)
                != (max(r["reward"] for r in unfiltered), sorted(r["reward"] for r in unfiltered)[len(unfiltered) // 2])
            )
    assert any(differs)  # the planted case: the mixed prefix would have given another population


def test_a_sigma_trial_naming_a_scale_the_bench_does_not_draw_is_one_error(tiny_dir, tmp_path):
    from corp.bench.sweep import run_bench

    opts = tiny_options(
        tiny_dir,
        tmp_path,
        sigmas=[0.05, 0.1],
        seeds=[1],
        settings=["paper"],
        compare=[],
        hyperparameters="search",
        trials=2,
        methods={"randopt": {"options": {"top_k": [1]}, "search": {"from_sigmas": [[0.05], [0.3]]}}},
    )
    with pytest.raises(CorpError, match=r"from_sigmas 0.3 is not a scale of the bench's sigmas"):
        run_bench(load_config(BenchConfig, None, opts))
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").rglob("population.jsonl"))


def test_from_sigmas_is_checked_before_any_model_loads(tmp_path):
    from corp.config import RandOptConfig

    with pytest.raises(CorpError, match=r"--from-sigmas selects specialists of --from-run"):
        load_config(RandOptConfig, None, {"model": "x", "task": "arith", "from_sigmas": "1e-3"})
    with pytest.raises(CorpError, match=r"--from-sigmas is '1e-3,x'"):
        load_config(RandOptConfig, None, {"model": "x", "task": "arith", "from_sigmas": "1e-3,x"})


def test_record_file_names_start_with_the_task_label(tmp_path):
    from corp.bench.sweep import load_bench_config, plan

    cfg = load_bench_config("configs/bench-cpu-2.yaml")
    cells, _ = plan(cfg)
    names = {c.record_name().split("__")[0] for c in cells}
    assert names == {"arith", "letters"}, names


def test_noise_scheme_variants_score_populations_of_their_own_scheme(tiny_dir, tmp_path):
    """configs/bench-noise.yaml's design on a tiny model: a variant per noise scheme gets its own
    shared population, scored under that scheme (its meta says so), at the same budget; a bug that
    shared one population between schemes would compare full-rank specialists with themselves."""
    from corp.bench.sweep import run_bench

    opts = tiny_options(
        tiny_dir,
        tmp_path,
        population=6,
        sigmas=[0.05],
        budgets=[3e7],
        seeds=[1, 2],
        settings=["paper"],
        compare=[["randopt-r1:randopt-top1", "randopt-full:randopt-top1"]],
        methods={
            "randopt": {
                "options": {"top_k": [1, 2]},
                "variants": {"randopt-full": {"noise": "full"}, "randopt-r1": {"noise": "lowrank:r=1"}},
            }
        },
    )
    run_bench(load_config(BenchConfig, None, opts))
    recs = {
        r["label"]: r
        for r in (json.loads(p.read_text()) for p in (tmp_path / "results" / "tiny" / "cells").glob("*.json"))
        if r["seed"] == 1
    }
    assert set(recs) == {"randopt-full", "randopt-r1"}
    full, low = Path(recs["randopt-full"]["population_run"]), Path(recs["randopt-r1"]["population_run"])
    assert full != low
    schemes = {p: json.loads((p / "population_meta.json").read_text()).get("noise_scheme") for p in (full, low)}
    assert "lowrank" in str(schemes[low]) and "r=1" in str(schemes[low]).replace(" ", ""), schemes
    assert "lowrank" not in str(schemes[full]), schemes
    for r in recs.values():
        assert r["units"] >= 2 and r["flops"] <= 3e7
    table = (tmp_path / "results" / "tiny" / "table.md").read_text()
    assert "randopt-r1:randopt-top1" in table and "randopt-full:randopt-top1" in table


def test_a_record_the_population_cap_bound_is_rerun_under_another_cap(tiny_dir, tmp_path):
    """`population` caps a cell's prefix but is not in its record's key: a record made when the cap
    bound (the budget would have bought more) is not reused after the cap is raised."""
    from corp.bench.sweep import run_bench

    def opts(population):
        return tiny_options(
            tiny_dir,
            tmp_path,
            population=population,
            budgets=[1e9],
            seeds=[1],
            settings=["paper"],
            compare=[],
            methods={"randopt": {"options": {"top_k": [1]}}},
        )

    def record():
        (path,) = (tmp_path / "results" / "tiny" / "cells").glob("*randopt*.json")
        return json.loads(path.read_text())

    run_bench(load_config(BenchConfig, None, opts(3)))
    first = record()
    assert first["units"] == 3 and first["budget_reached"] is False
    run_bench(load_config(BenchConfig, None, opts(5)))
    assert record()["units"] == 5


def test_the_headline_lists_a_method_that_fits_no_budget_and_only_its_own_misses():
    """Planted: GRPO fits neither budget, ES misses only the small one (no record there, e.g. not
    run yet), RandOpt fits both. GRPO must be listed with 'does not fit' at both; ES's missing
    cell must not be called 'does not fit' because another method did not fit there."""
    from corp.bench.config import headline_setting
    from corp.bench.report import headline_table

    cfg = load_config(
        BenchConfig,
        None,
        {"name": "h", "tasks": ["arith"], "seeds": [0, 1], "budgets": [1e12, 2e12], "methods": {"randopt": None}},
    )

    def row(cell, method, budget, acc, status="done"):
        return {
            "task": "arith",
            "setting": headline_setting(cfg),
            "cell": cell,
            "method": method,
            "budget": budget,
            "seed": 0,
            "accuracy": acc,
            "passes_per_example": None if acc is None else 1,
            "labelled_examples": None if acc is None else 16,
            "flops": 1e11,
            "status": status,
        }

    rows = [
        row("randopt", "randopt-top1", 1e12, 0.2),
        row("randopt", "randopt-top1", 2e12, 0.3),
        row("es", "es", 2e12, 0.25),
        row("grpo", "grpo", 1e12, None, "does not fit: 1 steps spent 3e12 FLOPs"),
        row("grpo", "grpo", 2e12, None, "does not fit: 1 steps spent 3e12 FLOPs"),
    ]
    lines = {line.split(" | ")[1]: line for line in headline_table(cfg, rows) if line.startswith("| arith")}
    assert set(lines) == {"randopt-top1", "es", "grpo"}, lines
    assert lines["grpo"].count("does not fit") == 2
    assert "does not fit" not in lines["es"] and "—" in lines["es"]


@pytest.mark.parametrize("where", ["bench", "method"])
def test_an_iterative_run_stopped_by_max_units_has_not_reached_its_budget(tiny_dir, tmp_path, where):
    """The cap from the bench's max_units, or from the method's own entry (ES's, whose member costs far
    more time than its FLOPs say) with the bench's left at its default."""
    from corp.bench.sweep import run_bench

    grpo = {"options": {"prompts_per_step": 2, "num_generations": 2}, "variants": {"grpo": {}}}
    opts = tiny_options(
        tiny_dir,
        tmp_path,
        budgets=[1e12],
        seeds=[1],
        settings=["paper"],
        compare=[],
        **({"max_units": 2} if where == "bench" else {}),
        methods={"grpo": {**grpo, **({"max_units": 2} if where == "method" else {})}},
    )
    run_bench(load_config(BenchConfig, None, opts))
    (path,) = (tmp_path / "results" / "tiny" / "cells").glob("*grpo*.json")
    rec = json.loads(path.read_text())
    assert rec["units"] == 2 and rec["budget_reached"] is False and rec["flops"] < 1e12


@pytest.mark.slow
def test_backend_agreement_reevaluates_the_bench_s_own_models_on_its_test_examples(swept, tmp_path):
    """benchmarks/bench_backend_agreement.py on the tiny bench, re-evaluating with the same engine
    (hf): the base and the saved models must reproduce every recorded test outcome (a script that
    evaluated other examples, another model or other settings would not)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_backend_agreement as agreement
    finally:
        sys.path.pop(0)
    items = agreement.sample_cells(swept["root"] / "results" / "tiny", 2)
    assert items[0]["row"] == "base" and len(items) == 3 and all(i["model"] for i in items[1:])
    # an iterative run's model/ is its last checkpoint: a smaller budget's record of the same run would
    # compare another model's outcomes with its own
    every = agreement.sample_cells(swept["root"] / "results" / "tiny", 100)
    iterative = [i["record"] for i in every if i["record"].get("kind") == "iterative"]
    assert iterative, "the tiny bench has ES/GRPO cells: the planted case is there"
    records = [json.loads(p.read_text()) for p in (swept["root"] / "results" / "tiny" / "cells").glob("*.json")]
    for rec in iterative:
        top = max(r["budget"] for r in records if r.get("run_dir") == rec["run_dir"])
        assert rec["budget"] == top, (rec["label"], rec["budget"], top)
    # a later session has the committed records but not the base cell's run directory: the base is still
    # re-evaluated, with the task options of another run of its task, on the same test examples
    cells = tmp_path / "later" / "cells"
    cells.mkdir(parents=True)
    for rec in records:
        if any(x["name"] == "base" for x in rec["rows"]):
            rec = {**rec, "run_dir": str(tmp_path / "gone")}
        (cells / f"{rec['label']}__{rec['setting']}__{rec['seed']}__{rec['budget']}.json").write_text(json.dumps(rec))
    base = agreement.sample_cells(tmp_path / "later", 1)[0]
    assert base["row"] == "base" and base["config_dir"] != base["record"]["run_dir"]
    got = agreement.evaluate(base, "hf", tmp_path / "again", threads=1)
    assert got["agree"] == got["n"] == 6, got
    for item in items:
        got = agreement.evaluate(item, "hf", tmp_path, threads=1)
        assert got["n"] == 6 and got["agree"] == got["n"], got


def test_methods_filter_runs_only_the_named_methods_cells(tiny_dir, tmp_path):
    """`corp bench --methods`: one process computes only its methods' cells (by variant label or
    registry name) while the outputs still cover every finished cell; an unknown name is one line
    before anything runs."""
    from corp.bench.sweep import run_bench

    over = dict(
        budgets=[1e8],
        settings=["paper"],
        seeds=[1],
        compare=[],
        methods={
            "self-consistency": {"options": {"k": [1]}},
            "randopt": {"options": {"top_k": [1]}},
            "es": {"skip": "not in this test"},
            "grpo": {"skip": "not in this test"},
            "consolidate": {"skip": "not in this test"},
            "ftis": {"skip": "not in this test"},
        },
    )

    def methods_done():
        return {json.loads(p.read_text())["method"] for p in (tmp_path / "results" / "tiny" / "cells").glob("*.json")}

    with pytest.raises(CorpError, match=r"--methods corp-r9: not a method of tiny; its methods \(variant labels\)"):
        run_bench(load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), only_methods=["corp-r9"])
    with pytest.raises(
        CorpError, match=r"--methods es: tiny does not run it \(not run in this bench: not in this test\)"
    ):
        run_bench(load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), only_methods=["es"])
    with pytest.raises(CorpError, match="--methods names no method"):
        run_bench(load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), only_methods=[])
    assert not (tmp_path / "results" / "tiny" / "cells").exists()
    summary = run_bench(
        load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), only_methods=["randopt"]
    )
    assert methods_done() == {"randopt"} and summary["not_run"] > 0
    run_bench(
        load_config(BenchConfig, None, tiny_options(tiny_dir, tmp_path, **over)), only_methods=["self-consistency"]
    )
    assert methods_done() == {"randopt", "self-consistency"}


@pytest.mark.slow
def test_bench_stages_counts_each_run_directory_once_and_reads_corps_timings(swept):
    """benchmarks/bench_stages.py: a method's wall is the sum over its run directories (cells that
    share one, an iterative run across budgets, count it once, at the largest wall), and CoRP's
    report times its Gram matrix, merged directions and save, so they are not lumped into `other`."""
    stages = _benchmark("bench_stages")
    cells = swept["root"] / "results" / "tiny" / "cells"
    records = [json.loads(p.read_text()) for p in sorted(cells.glob("*.json"))]
    corp = [r for r in records if r["label"] == "corp-stage1" and r["status"] == "done"]
    assert corp
    seconds = json.loads((Path(corp[0]["run_dir"]) / "report.json").read_text())["corp"]["seconds"]
    assert {"population", "gram", "merge", "step_search", "gate", "save", "test"} <= set(seconds), seconds

    def row(lines, label):
        (line,) = [x for x in lines if f"| {label} |" in x]
        return [c.strip() for c in line.strip("|").split("|")]

    lines = stages.stage_table(records, Path("."))
    es = [r for r in records if r["label"] == "es" and r["status"] == "done"]
    es_dirs = {r["run_dir"] for r in es}
    assert len(es) > len(es_dirs)  # the planted case: budgets share an ES run directory
    by_dir = {d: max(float(r["wall_seconds"]) for r in es if r["run_dir"] == d) for d in es_dirs}
    assert float(row(lines, "es")[3]) == pytest.approx(sum(by_dir.values()), abs=1)
    measured = stages.run_dir_stages(Path(corp[0]["run_dir"]))
    assert measured["noise math"] == pytest.approx(seconds["gram"] + seconds["merge"], abs=2e-3)
    assert measured["save"] == pytest.approx(seconds["save"], abs=1e-3)
    assert measured["noise math"] > 0 and measured["save"] > 0


def test_a_population_cells_first_try_is_sized_by_its_predecessors_own_evaluations(tmp_path, monkeypatch):
    """CoRP's own evaluations (step search, gates) come on top of its prefix, and every try at a
    prefix is a whole consolidate. The first cell of a chain (task, variant, setting, budget) starts
    from the prefix scoring alone affords and steps down; the next (another seed) starts from the
    prefix that fits beside the own FLOPs in its predecessor's record, so it runs once; a first try
    sized by an overestimate steps up again; and a fresh process sizes it the same way (the figure
    is read from the record, never from what this process happened to run last)."""
    from corp.bench.sweep import Bench, Cell
    from corp.methods import get_method

    cfg = load_config(
        BenchConfig,
        None,
        {"methods": {"consolidate": None}, "results_dir": str(tmp_path), "work_dir": str(tmp_path / "w")},
    )
    paths = len(get_method("consolidate").bench.flops)
    pop = {"run_dir": "w/pop", "scales": [1e-3], "costs": [1.0] * 40, "seconds": [0.0] * 40, "wall": 0.0}
    cells = [Cell("arith", "paper", seed, "consolidate", "corp-stage1", 12.0, {}) for seed in range(3)]
    ran = []

    def invoke(method, opts):
        ran.append(opts["population"])
        return {"flops": opts["population"] + 5.0}, 0.0  # own evaluations: 5 FLOPs whatever the prefix

    def bench_with_fakes():
        bench = Bench(cfg)
        bench.cells = cells
        monkeypatch.setattr(bench, "population", lambda cell: pop)
        monkeypatch.setattr(bench, "_invoke", invoke)
        monkeypatch.setattr(
            bench,
            "_record",
            lambda cell, report, run_dir, wall, units, chosen: {
                **bench._head(cell),  # a whole record: the bench checks what it writes (corp.bench.records)
                "units": units,
                "status": "done",
                "rows": [],
                "flops": 0.0,
                "wall_seconds": 0.0,
            },
        )
        return bench

    monkeypatch.setattr("corp.bench.cells.get_path", lambda report, path: report["flops"] / paths)
    bench = bench_with_fakes()
    first = bench.run_cell(cells[0])
    assert ran == [12, 7] and first["units"] == 7 and first["own_flops"] == 5.0 and first["own_estimate"] is None
    ran.clear()
    second = bench.run_cell(cells[1])
    assert ran == [7] and second["units"] == 7 and second["own_estimate"] == 5.0
    # an overestimate in the predecessor's record: the first try fits with room to spare and steps up
    rec = json.loads(bench.record_path(cells[1]).read_text())
    bench.record_path(cells[1]).write_text(json.dumps({**rec, "own_flops": 8.0}))
    ran.clear()
    third = bench_with_fakes().run_cell(cells[2])
    assert ran == [4, 7] and third["units"] == 7 and third["own_flops"] == 5.0
    # a fresh process recomputing seed 1 sizes it as the uninterrupted run did (from seed 0's record)
    bench.record_path(cells[1]).unlink()
    ran.clear()
    assert bench_with_fakes().run_cell(cells[1])["units"] == 7 and ran == [7]
    # the first final of a setting is sized by its variant's last trial at that budget (trials run first)
    trial = Cell("arith", "tune", 0, "consolidate", "corp-stage1", 12.0, {}, trial=0)
    final = Cell("arith", "equal-data", 0, "consolidate", "corp-stage1", 12.0, {})
    cells[:] = [trial, final]
    ran.clear()
    bench = bench_with_fakes()
    assert bench.run_cell(trial)["units"] == 7 and ran == [12, 7], "the first trial has no predecessor"
    ran.clear()
    assert bench.run_cell(final)["own_estimate"] == 5.0 and ran == [7], "sized from the trial: one try"


def test_es_unit_evals_count_only_the_drawn_examples():
    """ES's lower bound on a run's cost (preflight's "too small for every method") charges
    prompts_per_iteration of the support split per evaluation, not the whole split."""
    from corp.methods import get_method

    ES = get_method("es").bench
    base = {"population": 4, "skip_centre_eval": True, "n_support": 144}
    assert ES.unit_evals(base) == 4.0
    assert ES.unit_evals({**base, "prompts_per_iteration": 16}) == pytest.approx(4 * 16 / 144)
    assert ES.unit_evals({**base, "prompts_per_iteration": 500}) == 4.0


def test_bench_stages_reads_every_try_of_a_population_cell(tmp_path):
    """A population cell's wall pays for its tries over the budget (each a run directory of its own,
    listed in `tried`): their generation counts, not 'other'."""
    stages = _benchmark("bench_stages")
    for name in ("over", "fit"):
        (tmp_path / name).mkdir()
        row = {"key": name, "kind": "direction", "seconds": 10.0, "apply_seconds": 0.0}
        (tmp_path / name / "evals.jsonl").write_text(json.dumps(row) + "\n")
    rec = {
        "status": "done",
        "task": "arith",
        "task_label": "arith",
        "label": "corp-stage1",
        "setting": "paper",
        "wall_seconds": 40.0,
        "run_dir": "fit",
        "tried": [{"units": 9, "run_dir": "over"}, {"units": 7, "run_dir": "fit"}],
    }
    (line,) = [x for x in stages.stage_table([rec], tmp_path) if "| corp-stage1 |" in x]
    cols = [c.strip() for c in line.strip("|").split("|")]
    assert cols[3] == "40" and cols[4] == "50%", cols  # 20 s of generation in 40 s: both tries read
    # an earlier session's record whose run directory is gone: its 400 s would all read as 'other'
    gone = {**rec, "run_dir": "gone", "tried": [], "seed": 1, "wall_seconds": 400.0}
    (line,) = [x for x in stages.stage_table([rec, gone], tmp_path) if "| corp-stage1 |" in x]
    cols = [c.strip() for c in line.strip("|").split("|")]
    assert cols[2] == "0 + 1 (1 without run directory, not counted)" and cols[3] == "40" and cols[4] == "50%", cols


def test_a_task_entry_may_run_fewer_seeds(tiny_dir, tmp_path):
    """`{task, label, seeds}`: that task's final cells run only its seeds (the headline task keeps all
    of them); trials still run on the bench's first seed, and the tables say which seeds each task has."""
    from corp.bench.report import regime_text
    from corp.bench.sweep import plan

    opts = tiny_options(
        tiny_dir,
        tmp_path,
        seeds=[1, 2, 3],
        tasks=[{"task": "arith", "label": "a"}, {"task": "arith:digits=2", "label": "b", "seeds": [3, 1]}],
    )
    cfg = load_config(BenchConfig, None, opts)
    cells, _ = plan(cfg)
    seeds = {label: {c.seed for c in cells if c.task_label == label and c.setting != "tune"} for label in "ab"}
    assert seeds == {"a": {1, 2, 3}, "b": {1, 3}}
    assert cfg.seeds_of("arith:digits=2") == [1, 3]  # in the bench's order
    assert "seeds 1, 2, 3 (b: 1, 3)" in regime_text(cfg)


def _bench_process(opts: dict, out) -> None:
    import os

    os.environ["CORP_BENCH_WAIT"] = "0.5"
    os.environ["CORP_NO_PROGRESS"] = "1"
    from corp.bench.sweep import run_bench
    from tests.test_methods import count_model_calls

    with count_model_calls() as calls:
        run_bench(load_config(BenchConfig, None, opts), "corp bench --config tiny.yaml")
    out.put(calls["generate"])


@pytest.mark.slow
def test_two_processes_share_one_task_and_compute_what_one_would(tiny_dir, tmp_path):
    """Two `corp bench` processes on the same task: each runs the cells no other holds (a claim per
    cell; a run directory another process holds defers the cell), a final waits for trials the
    other is running, and the records are those of one process alone, each cell computed once."""
    import multiprocessing as mp

    over = dict(
        budgets=[1e8, 2e8],
        settings=["paper"],
        seeds=[1, 2],
        compare=[],
        hyperparameters="search",
        trials=2,
        methods={
            "self-consistency": {"options": {"k": [1]}},
            "randopt": {"options": {"top_k": [1]}, "search": {"from_sigmas": [[0.05], [0.05, 0.1]]}},
            "consolidate": {
                "options": {"alphas": [1, 2], "gate_z": -10.0},
                "variants": {"corp-stage1": {"rounds": 0}},
                "search": {"betas": [[1.0], [10.0]]},
            },
            "es": {"options": {"population": 2, "alpha": 0.05}, "search": {"sigma": [0.05, 0.1]}},
            "grpo": {"skip": "not in this test"},
            "ftis": {"skip": "not in this test"},
        },
        sigmas=[0.05, 0.1],
    )
    alone = tiny_options(tiny_dir, tmp_path / "alone", **over)
    spawn = mp.get_context("spawn")
    q = spawn.Queue()
    p = spawn.Process(target=_bench_process, args=(alone, q))
    p.start()
    p.join(timeout=600)
    assert p.exitcode == 0
    calls_alone = q.get()
    shared = tiny_options(tiny_dir, tmp_path / "shared", **over)
    procs = [spawn.Process(target=_bench_process, args=(shared, q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    calls = [q.get(), q.get()]
    assert all(c > 0 for c in calls), calls  # both computed cells

    def records(root):
        out = {}
        for path in sorted((root / "results" / "tiny" / "cells").glob("*.json")):
            rec = json.loads(path.read_text())
            out[path.name] = (rec["status"], rec.get("units"), [(r["name"], r["accuracy"]) for r in rec["rows"]])
        return out

    assert records(tmp_path / "shared") == records(tmp_path / "alone")
    # each cell once: the only generation both may do is a row of the task's shared evaluation cache
    # (the base on a split) that both need at the same moment; without the claims this is about +30
    assert sum(calls) <= calls_alone + 8, (calls, calls_alone)


@pytest.mark.slow
def test_bench_stages_with_the_config_counts_only_planned_records(swept, tmp_path, monkeypatch):
    """`bench_stages.py --config`: a record a changed config left behind (another key) is not counted."""
    import runpy
    import shutil
    import sys

    import yaml

    results = tmp_path / "results"
    shutil.copytree(swept["root"] / "results" / "tiny", results)
    es = sorted((results / "cells").glob("*__es__*.json"))
    assert es
    orphan = json.loads(es[0].read_text())
    (results / "cells" / es[0].name.replace("__es__", "__es__old")).write_text(
        json.dumps({**orphan, "wall_seconds": 1e6})
    )
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_options(Path(swept["cfg"].model), swept["root"])))

    def es_wall(*extra):
        out = tmp_path / "stages.md"
        argv = ["bench_stages.py", "--results", str(results), "--out", str(out), *extra]
        monkeypatch.setattr(sys, "argv", argv)
        runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "bench_stages.py"), run_name="__main__")
        (line,) = [x for x in out.read_text().splitlines() if "| es |" in x]
        return float(line.split("|")[4])

    assert es_wall() >= 1e6  # the orphan counts without --config
    assert es_wall("--config", str(config)) < 1e6


def test_an_iterative_cell_grows_short_of_the_budget_so_a_dearer_unit_cannot_waste_it(tmp_path, monkeypatch):
    """Units can cost more than any seen (a diverging GRPO run generates longer answers). Growing by
    all the remaining budget at the dearest cost seen then crosses the budget and falls back to the
    previous checkpoint, far below it (bench-cpu-2: 22 GRPO steps, 1.2e13 of 2.8e13); aiming at 90%
    of what is left, the cell ends near the budget, and never over it."""
    from corp.bench.sweep import Bench, Cell

    cfg = load_config(
        BenchConfig, None, {"methods": {"es": None}, "results_dir": str(tmp_path), "work_dir": str(tmp_path / "w")}
    )
    bench = Bench(cfg)

    def cost(units):  # 1 FLOP per unit up to 10, 1.1 after
        return min(units, 10) + 1.1 * max(0, units - 10)

    grown = []

    def invoke(method, opts):
        grown.append(opts["iterations"])
        return {"training_ledger": {"flops": cost(opts["iterations"])}, "iterations": opts["iterations"]}, 0.0

    monkeypatch.setattr(bench, "_invoke", invoke)
    monkeypatch.setattr(bench, "_record", lambda cell, report, run_dir, wall, units, chosen: {"units": units})
    rec = bench._iterative(Cell("arith", "paper", 0, "es", "es", 30.0, {"iterations": 10}))
    assert grown[0] == 1 and rec["units"] >= 26, (grown, rec)  # the old full step: 10 -> 30 (32 FLOPs) -> 10
    assert cost(rec["units"]) <= 30.0 and rec["budget_reached"]


def _report_rows(cfg, outcomes: dict, unfit: dict | None = None) -> list[dict]:
    """Rows as flat_rows makes them: outcomes[(cell, name, seed)] = per-example 0/1 list; unfit[(cell, seed)]."""
    from corp.bench.config import headline_setting
    from corp.bench.report import flat_rows

    recs: dict[tuple, dict] = {}
    for (cell, name, seed), correct in outcomes.items():
        rec = recs.setdefault(
            (cell, seed),
            {
                "task": "arith",
                "setting": headline_setting(cfg),
                "label": cell,
                "budget": 1e12,
                "seed": seed,
                "status": "done",
                "flops": 9e11,
                "wall_seconds": 1.0,
                "example_ids": list(range(len(correct))),
                "tuning": {"chosen": {"x": 1}} if cell != "base" else None,
                "rows": [],
            },
        )
        rec["rows"].append(
            {
                "name": name,
                "accuracy": sum(correct) / len(correct),
                "passes_per_example": 1,
                "labelled_examples": 16,
                "test_tokens": 1,
                "test_flops": 1.0,
                "correct": correct,
            }
        )
    for (cell, seed), reason in (unfit or {}).items():
        recs[(cell, seed)] = {
            "task": "arith",
            "setting": headline_setting(cfg),
            "label": cell,
            "budget": 1e12,
            "seed": seed,
            "status": "does not fit",
            "reason": reason,
            "flops": 0.0,
            "wall_seconds": 1.0,
            "rows": [],
        }
    return flat_rows(list(recs.values()))


def test_a_comparison_with_one_seed_makes_no_claim_and_a_left_out_seed_is_named():
    """Planted: randopt-top1 is far above the base in every seed where it ran, but it ran in one seed only
    (the other does not fit). A within-seed interval excludes 0 there; the report must still make no
    "beats" claim, and must name the left-out seed and why. With both seeds the same effect is a claim."""
    from corp.bench.report import beats_sentences, comparisons, comparisons_table

    cfg = load_config(
        BenchConfig,
        None,
        {
            "name": "c",
            "tasks": ["arith"],
            "seeds": [0, 1, 2],
            "budgets": [1e12],
            "methods": {"randopt": None},
            "compare": [["randopt-top1", "base"]],
        },
    )
    good, bad = [1] * 40 + [0] * 10, [0] * 40 + [1] * 10
    one = _report_rows(
        cfg,
        {("randopt", "randopt-top1", 0): good, **{("base", "base", s): bad for s in (0, 1, 2)}},
        unfit={("randopt", 1): "1 specialist spent 2e12 FLOPs"},
    )
    comps = comparisons(cfg, one)
    assert len(comps) == 1 and comps[0]["ci95"][0] > 0, "the within-seed interval excludes 0: the case is planted"
    (sentence,) = beats_sentences(comps)
    assert " beats " not in sentence and "one seed only, no claim" in sentence, sentence
    assert "seed 1: randopt-top1 does not fit" in sentence and "seed 2: randopt-top1 not run yet" in sentence, sentence
    table = "\n".join(comparisons_table(comps))
    assert "no claim" in table and "seed 1: randopt-top1 does not fit" in table
    both = _report_rows(
        cfg,
        {
            **{("randopt", "randopt-top1", s): good[5 * s :] + good[: 5 * s] for s in (0, 1, 2)},
            **{("base", "base", s): bad for s in (0, 1, 2)},
        },
    )
    (sentence,) = beats_sentences(comparisons(cfg, both))
    assert sentence.startswith("randopt-top1 beats base") and "3 seeds x 50 test examples" in sentence, sentence
    assert "n = 150" not in sentence, "pooled pairs are not independent examples"


def test_ties_are_signed_with_an_equals_sign_and_tuned_rows_show_their_validation_labels():
    from corp.algorithms.stats import sign_text
    from corp.bench.report.prose import labelled_text

    assert sign_text({"signs": {"+": 2, "-": 1, "0": 2}}) == "2+ 1- 2=", "'20' would read as twenty ties"
    cfg = load_config(
        BenchConfig,
        None,
        {"name": "l", "tasks": ["arith"], "seeds": [0, 1], "budgets": [1e12], "methods": {"randopt": None}},
    )
    total = cfg.n_support + cfg.n_probe + cfg.n_validation
    assert labelled_text(cfg, {"labelled_examples": 0, "tuned": False}) == "0"
    assert labelled_text(cfg, {"labelled_examples": 0, "tuned": True}) == f"0 + {cfg.n_validation} val"
    assert labelled_text(cfg, {"labelled_examples": total, "tuned": True}) == f"{total} (tuned on val)"


def test_trial_flops_count_each_trial_once_at_its_top_budget():
    from corp.bench.report import trial_flops

    recs = [
        {"task": "a", "label": "es", "trial": t, "budget": b, "flops": f}
        for t in (0, 1)
        for b, f in ((1e12, 0.9e12), (2e12, 1.9e12))
    ] + [{"task": "a", "label": "self-consistency", "trial": 0, "budget": None, "flops": 0.0}]
    assert trial_flops(recs) == {"es": 3.8e12, "self-consistency": 0.0}


def test_the_label_prior_reference_scores_the_majority_answer_of_the_labelled_examples(monkeypatch):
    """Planted: a task whose labelled examples are 80% '1' and whose test answers are 60% '1'. The
    reference row answers '1' everywhere and must score 0.6 on test, with the task's own check, in
    every seed; a method that only learned to say '1' would match it."""
    from corp.bench.report import LABEL_PRIOR, headline_table, label_prior_rows
    from corp.evaluate.tasks.base import Example, Task

    class Prior(Task):
        name = "prior"

        def pools(self):
            test = [Example(f"t{i}", "q", "1" if i < 6 else "2") for i in range(10)]
            train = [Example(f"s{i}", "q", "1" if i % 5 else "3") for i in range(20)]
            return {"train": train, "test": test}

        def extract(self, completion):
            return completion.strip()

    monkeypatch.setattr("corp.bench.report.rows.get_task", lambda spec, data=None: Prior())
    cfg = load_config(
        BenchConfig,
        None,
        {
            "name": "p",
            "tasks": ["arith"],
            "seeds": [0, 1],
            "budgets": [1e12],
            "methods": {"randopt": None},
            "n_support": 4,
            "n_probe": 3,
            "n_validation": 3,
            "n_test": 10,
        },
    )
    rows = label_prior_rows(cfg, ["arith"])
    assert [r["seed"] for r in rows] == [0, 1] and {r["accuracy"] for r in rows} == {0.6}, rows
    assert rows[0]["labelled_examples"] == 10 and "'1'" in rows[0]["status"] and rows[0]["flops"] == 0.0
    line = next(x for x in headline_table(cfg, rows) if f"| {LABEL_PRIOR} |" in x)
    assert "0.600 (reference)" in line and "| 10 | 0 |" in line, line


def test_the_reading_states_only_claims_the_intervals_allow_and_names_a_label_prior_above_every_model():
    """Planted: randopt-top1 is far above the base in 3 seeds (a claim), es is level with randopt-top1 (no
    claim), and the majority answer scores above every model. The plain-words reading must state the
    claim in full (interval and FLOPs), list the level pair as showing no difference, and say that the
    task's gains mostly measure its label prior; with the prior below the best model it must not."""
    from corp.bench.report import LABEL_PRIOR, comparisons, reading_lines

    cfg = load_config(
        BenchConfig,
        None,
        {
            "name": "r",
            "tasks": ["arith"],
            "seeds": [0, 1, 2],
            "budgets": [1e12],
            "methods": {"randopt": None, "es": None},
            "compare": [["randopt-top1", "base"], ["es", "randopt-top1"]],
        },
    )
    good, bad = [1] * 40 + [0] * 10, [0] * 40 + [1] * 10
    rows = _report_rows(
        cfg,
        {
            **{("randopt", "randopt-top1", s): good[5 * s :] + good[: 5 * s] for s in (0, 1, 2)},
            **{("es", "es", s): good[3 * s + 1 :] + good[: 3 * s + 1] for s in (0, 1, 2)},
            **{("base", "base", s): bad for s in (0, 1, 2)},
        },
    )

    def prior(acc):
        return [
            {
                **rows[0],
                "method": LABEL_PRIOR,
                "cell": LABEL_PRIOR,
                "budget": None,
                "seed": s,
                "accuracy": acc,
                "passes_per_example": 0,
                "flops": 0.0,
                "answer": "1",
            }
            for s in (0, 1, 2)
        ]

    comps = comparisons(cfg, rows)
    text = "\n".join(reading_lines(cfg, rows + prior(0.9), comps))
    claim = next(line for line in text.splitlines() if " beats " in line)
    assert claim.startswith("- randopt-top1 beats base") and "95% CI" in claim and "FLOPs" in claim, claim
    assert "No difference shown" in text and "es vs randopt-top1 (arith 1e+12)" in text, text
    assert "es beats" not in text and "randopt-top1 beats es" not in text, text
    assert "highest mean test accuracy of a single model is randopt-top1's 0.800 over 3 seeds (base 0.200)" in text
    assert "The majority answer '1'" in text and "mostly measure" in text, text
    assert "majority answer" not in "\n".join(reading_lines(cfg, rows + prior(0.3), comps)), "a weak prior is no caveat"


def test_time_per_method_adds_the_population_a_cell_read_and_takes_medians_over_seeds():
    """Planted: RandOpt's cells spend 60 s of their own beside a population prefix that took 600 s to
    score (11 min each), ES's cumulative wall is 2, 4 and 30 min over seeds (median 4), and one ES trial ran
    two budgets (counted once, at its top one). A table that left out the population, or averaged the
    outlier seed in, or summed a trial's budgets, would show other figures."""
    from corp.bench.report import time_table

    cfg = load_config(
        BenchConfig,
        None,
        {"name": "t", "tasks": ["arith"], "seeds": [0, 1, 2], "budgets": [1e12, 2e12], "methods": {"randopt": None}},
    )

    def rec(label, budget, seed, wall, pop=None, setting="equal-data", trial=None):
        return {
            "task": "arith",
            "label": label,
            "budget": budget,
            "seed": seed,
            "setting": setting,
            "trial": trial,
            "status": "done",
            "wall_seconds": wall,
            "population_seconds": pop,
        }

    records = [rec("randopt", 2e12, s, 60.0, 600.0) for s in (0, 1, 2)]
    records += [rec("es", 2e12, s, w) for s, w in ((0, 120.0), (1, 240.0), (2, 1800.0))]
    tuning = [rec("es", b, 0, w, setting="tune", trial=0) for b, w in ((1e12, 60.0), (2e12, 180.0))]
    text = "\n".join(time_table(cfg, records, tuning))
    assert "| arith | randopt |  |  | 11.0 (3) |  |" in text, text
    assert "| arith | es |  |  | 4.0 (3) | 3.0 (1) |" in text, text


def test_noise_summary_pivots_schemes_and_shows_a_loss_only_where_the_interval_is_below_zero(tmp_path):
    """benchmarks/bench_noise_summary.py: one column per noise scheme (whatever the variant is called),
    a low-rank row 'is worse' only where its interval excludes 0, else the largest loss not excluded,
    and seconds per specialist from each cell's population seconds / specialists."""
    summ = _benchmark("bench_noise_summary")
    cols = "task,task_label,method,setting,budget,seed,accuracy,passes_per_example,labelled_examples,test_tokens,test_flops,flops,wall_seconds,population_seconds,units,status,hyperparameters"
    hp = lambda noise, sig: json.dumps({"noise": noise, "from_sigmas": sig})  # noqa: E731
    lines = [cols]
    for seed, (full, r4) in enumerate([(0.30, 0.20), (0.32, 0.21), (0.28, 0.19)]):
        for name, a, noise, secs in (
            ("randopt-full:randopt-top1", full, "full", 600.0),
            ("randopt-lr-four:randopt-top1", r4, "lowrank:r=4", 300.0),  # the column comes from the noise, not the name
            ("corp-full", full + 0.01, "full", 600.0),
        ):
            # seed 2's CoRP gate kept the base: its row counts, as the model CoRP returned
            status = "abstained (= base)" if (name, seed) == ("corp-full", 2) else "done"
            lines.append(
                f"arith,arith,{name},paper,2.8e+13,{seed},{a},1,144,0,0,2.8e13,10,{secs},100,{status},"
                + '"'
                + hp(noise, [0.001]).replace('"', '""')
                + '"'
            )
        # as the bench writes it: the base has no budget
        lines.append(f'arith,arith,base,paper,,{seed},0.1,1,0,0,0,0,1,,,done,"{{""k"": [1], ""n_test"": 300}}"')
    (tmp_path / "results.csv").write_text("\n".join(lines) + "\n")
    comps = [
        dict(
            a="randopt-lr-four:randopt-top1",
            b="randopt-full:randopt-top1",
            difference=-0.1,
            ci95=[-0.12, -0.08],
            n_seeds=3,
            signs={"+": 0, "-": 3, "0": 0},
            budget=2.8e13,
        ),
        dict(  # the base's row has no noise: read as "full", this must not be drawn as a scheme comparison
            a="randopt-lr-four:randopt-top1",
            b="base",
            difference=0.1,
            ci95=[0.08, 0.12],
            n_seeds=3,
            signs={"+": 3, "-": 0, "0": 0},
            budget=2.8e13,
        ),
        dict(
            a="corp-full",
            b="base",
            difference=0.05,
            ci95=[-0.02, 0.12],
            n_seeds=3,
            signs={"+": 2, "-": 0, "0": 1},
            budget=2.8e13,
        ),
    ]
    (tmp_path / "bench.json").write_text(json.dumps({"budgets": [2.8e13], "comparisons": comps}))
    text = summ.summary(tmp_path)
    assert "| method | full | lowrank:r=4 |" in text
    assert "| randopt-top1 | 0.300 ± 0.020 (3; σ 0.001) | 0.200 ± 0.010 (3; σ 0.001) |" in text
    assert "| corp | 0.310 ± 0.020 (3; 1 abstained (= base); σ 0.001) | not run |" in text
    assert "Base (greedy): 0.100." in text
    assert "randopt-lr-four:randopt-top1 is worse" in text
    assert "no difference shown; a loss larger than 0.020 is excluded" in text
    assert "| lowrank:r=4 | 3.00 | 2.00x the specialists/hour |" in text
    assert summ.main(["--results", str(tmp_path / "nothing")]) == 2
    # the plot draws low-rank − full-rank only: a comparison against the base is no noise-scheme comparison
    assert summ.plot(tmp_path, tmp_path / "d.png") == 1
    assert (tmp_path / "d.png").stat().st_size > 0


# bench-cpu-2 (126 cells) only in the full suite; bench-noise, the same check on fewer cells, in the fast one
@pytest.mark.parametrize("name", [pytest.param("bench-cpu-2", marks=pytest.mark.slow), "bench-noise"])
def test_report_only_regenerates_the_committed_bench_byte_for_byte(name, tmp_path):
    """The committed cells still carry the keys this corp plans (a new option or a changed default in
    a cell's options renames every record, and the bench would then find none and rerun them all),
    and the tables regenerate exactly. Seen: `--device auto` as the new default renamed all 126."""
    import shutil

    from corp.bench.sweep import load_bench_config, run_bench

    repo = Path(__file__).resolve().parents[1]
    committed = repo / "results" / name
    shutil.copytree(committed, tmp_path / name)
    cfg = load_bench_config(str(repo / "configs" / f"{name}.yaml"), {"results_dir": str(tmp_path)})
    summary = run_bench(cfg, f"corp bench --config configs/{name}.yaml", True, False)
    assert summary["not_run"] == 0, f"{summary['not_run']} committed cells were not found under this corp's keys"
    for f in ("results.csv", "table.md"):
        assert (tmp_path / name / f).read_bytes() == (committed / f).read_bytes(), f


@pytest.mark.parametrize(
    "xs, plain", [([5.22e13, 5.99e13], ["5.2e+13", "6e+13"]), ([2.7725e13, 2.7793e13], ["2.77e+13", "2.78e+13"])]
)
def test_a_narrow_flops_axis_gets_a_few_plain_labels_not_every_minor_tick(xs, plain):
    """Seen in bench-noise-3's plot: one budget, methods spending 5.2e13 and 6e13, and matplotlib's log axis
    labelled every minor tick in between as 'a x 10^13', the labels running into each other. Across a wide
    range (bench-cpu-3's 1.3e13 to 2.4e14) matplotlib's own labels are kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from corp.bench.report.plots import _narrow_log_ticks

    def labels(points):
        fig, ax = plt.subplots()
        ax.errorbar(points, [0.2] * len(points), yerr=[0.01] * len(points))
        ax.set_xscale("log")
        _narrow_log_ticks(ax, points)
        fig.canvas.draw()
        lo, hi = ax.get_xlim()
        shown = [
            t.get_text()
            for minor in (False, True)
            for t, x in zip(ax.get_xticklabels(minor=minor), ax.get_xticks(minor=minor))
            if t.get_text() and lo <= x <= hi
        ]
        plt.close(fig)
        return shown

    assert labels(xs) == plain
    assert all("10^{13}" in t or "10^{14}" in t for t in labels([1.3e13, 2.4e14])), (
        "a wide axis keeps matplotlib's labels"
    )


def _corp_cell(seed: int, accepted: bool, acc: float, candidate: float | None = None, label: str = "corp") -> dict:
    """A CoRP cell record as the gate section reads it: its row, and what the gate decided."""
    detail: dict = {"accepted": accepted, "reason": "..."}
    if candidate is not None:  # recorded since issue 55 when the gate kept the base
        detail["candidate_test"] = {"candidate": "m2", "deployed": False, "accuracy": candidate, "base_accuracy": acc}
    row = {"name": label, "report_row": "corp" if accepted else "corp (abstained=base)", "accuracy": acc}
    pop = {"name": f"{label}/randopt-top1", "report_row": "randopt-top1", "accuracy": 0.9, "population_row": True}
    return {
        "task": "arith",
        "setting": "equal-data",
        "seed": seed,
        "label": label,
        "rows": [row, pop],
        "detail": detail,
    }


def test_the_bench_counts_what_the_gate_cost_and_saved_on_test():
    """Issue 55: across the bench's CoRP cells, how often the gate kept the base where its candidate was better on
    test (its cost), where it was worse (what it saved), and deployed a candidate worse than the base; a cell
    recorded before the candidate's test score was is counted as not recorded."""
    from corp.bench.report.gate import gate_section

    base = {"task": "arith", "setting": "equal-data", "label": "self-consistency"}
    records = [
        *({**base, "seed": s, "rows": [{"name": "base", "report_row": "base", "accuracy": 0.2}]} for s in range(6)),
        _corp_cell(0, True, 0.3),  # deployed, better than the base's 0.2
        _corp_cell(1, True, 0.1),  # deployed, worse
        _corp_cell(2, False, 0.2, candidate=0.35),  # kept the base; the candidate was better: the cost
        _corp_cell(3, False, 0.2, candidate=0.05),  # kept; the candidate was worse: saved
        _corp_cell(4, False, 0.2, candidate=0.2),  # kept; tied
        _corp_cell(5, False, 0.2),  # kept, an older record: not recorded
        {**_corp_cell(0, False, 0.2, candidate=0.9), "setting": "tune"},  # a trial: not a final cell
    ]
    lines = gate_section(records)
    assert lines[0] == "## The gate's decisions on test"
    assert "| corp | 6 | 2 | 1 (mean -0.100) | 4 | 1 (mean +0.150) | 1 (mean -0.150) | 1 | 1 |" in lines, lines
    assert gate_section(records[:6]) == [], "no CoRP cell, no section"


def test_a_methods_budget_share_caps_what_its_trials_and_finals_spend_while_its_rows_keep_the_budget(
    tmp_path, monkeypatch
):
    """Charged tuning (`budget_share`): a method's trials and finals each spend share x the budget, so that with
    its trials charged its final models cost the budget (GRPO at 1.5B: 2 trials and 3 finals at 0.6). Planted:
    without the share the cell grows to the budget (the bug: the trials come free); with 0.6 it stops at 0.6 x
    the budget, its record keeps the budget and says the share, and its file name differs from the uncharged
    cell's (a record never stands for both). Other methods keep the whole budget."""
    from corp.bench.plan import plan
    from corp.bench.records import check_record
    from corp.bench.sweep import Bench

    base = {"results_dir": str(tmp_path), "work_dir": str(tmp_path / "w"), "budgets": [30.0]}
    spent = {}
    for share in (None, 0.6):
        spec = {"options": {"iterations": 10}} | ({"budget_share": share} if share else {})
        cfg = load_config(BenchConfig, None, {**base, "methods": {"es": spec, "randopt": None}})
        bench = Bench(cfg)

        def invoke(method, opts):
            return {"training_ledger": {"flops": float(opts["iterations"])}, "iterations": opts["iterations"]}, 0.0

        monkeypatch.setattr(bench, "_invoke", invoke)
        monkeypatch.setattr(bench, "_record", lambda cell, report, run_dir, wall, units, chosen: {"units": units})
        cells, _ = plan(cfg)
        es = next(c for c in cells if c.method == "es" and c.setting != "tune")
        assert next(c for c in cells if c.method == "randopt").share == 1.0
        rec = bench._iterative(es)
        spent[share] = (rec["units"], es.record_name(), bench._head(es))
        check_record({**bench._empty(es, "planted"), **bench._head(es)})  # a record with its share is a valid record
        assert cfg.row_share("es") == (share or 1.0) and cfg.row_share("base") == 1.0
    assert 26 <= spent[None][0] <= 30 and "budget_share" not in spent[None][2]
    assert 16 <= spent[0.6][0] <= 18, spent[0.6]  # 0.6 x 30
    assert spent[0.6][2]["budget"] == 30.0 and spent[0.6][2]["budget_share"] == 0.6
    assert spent[0.6][1] != spent[None][1] and "__share0.6__" in spent[0.6][1]
    assert spent[0.6][1].split("__")[-1] != spent[None][1].split("__")[-1]  # its run is not the uncharged one


@pytest.mark.parametrize("bad", [0, 1.5, -0.2, True, "half"])
def test_a_budget_share_outside_zero_to_one_is_refused_in_one_line(tmp_path, bad):
    with pytest.raises(CorpError, match=r"method 'es': budget_share must be a number in \(0, 1\]"):
        load_config(BenchConfig, None, {"results_dir": str(tmp_path), "methods": {"es": {"budget_share": bad}}})
