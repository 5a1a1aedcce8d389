"""Issue 55: a searched value that lands on the edge of its grid is flagged in report.json (`edge_flags`),
the printed report and the model card: CoRP's step search (alpha, q, beta), RandOpt's top-1 sigma and the
bench's tuning search, all through corp.grids.edge."""

import json

from corp.algorithms.corp_operator.config import OperatorConfig
from corp.algorithms.corp_operator.stage1 import consolidate_stage1
from corp.grids import edge, edge_flag, edge_line
from tests.conftest import tiny_consolidate_config
from tests.test_consolidate import PlantedProblem, population


def test_edge_is_the_smallest_or_largest_of_a_grid_of_several_values():
    assert edge(8, [1, 2, 4, 8]) == "max" and edge(1, [4, 1, 2]) == "min" and edge(2, [1, 2, 4]) is None
    assert edge(8, [8]) is None and edge(8, [8, 8.0]) is None, "one value searched: no edge to speak of"
    assert edge([0.75], [[0.5], [0.75]]) == "max", "the bench's one-value lists"
    assert edge([5e-4], [[5e-4, 1e-3], [5e-4]]) is None, "a grid of sets of values has no order"
    flag = edge_flag("alpha", 8, [1, 2, 4, 8], "--alphas")
    assert flag == {"name": "alpha", "chosen": 8, "grid": [1, 2, 4, 8], "edge": "max", "option": "--alphas"}
    assert edge_line(flag) == (
        "alpha = 8 is the largest value searched (1, 2, 4, 8); a larger one may be better: pass --alphas with a "
        "larger value"
    )
    assert "(1e-05, 5e-05)" in edge_line(edge_flag("learning_rate", 1e-5, [5e-5, 1e-5])), "shown in order"
    assert edge_flag("alpha", 2, [1, 2, 4]) is None


def test_a_step_search_whose_best_alpha_is_the_grids_largest_is_flagged(tiny_model):
    """The planted problem rewards any step along the planted direction, more for a larger one: on a grid of
    small steps the best alpha is the largest, and the operator's config flags it (q and beta: one value)."""
    problem = PlantedProblem(tiny_model)
    seeds, sigmas, rewards = population(problem)
    cfg = OperatorConfig(alphas=[0.25, 0.5]).validate()
    res = consolidate_stage1(rewards, seeds, sigmas, problem.params, problem, cfg, progress=False)
    assert res.best.params["alpha"] == 0.5, res.best.name
    assert cfg.edge_flags(res.best.params) == [
        {"name": "alpha", "chosen": 0.5, "grid": [0.25, 0.5], "edge": "max", "option": "--alphas"}
    ]
    wide = OperatorConfig(alphas=[0.25, 0.5, 8.0], quantiles=[0.3, 0.5, 0.9]).validate()
    assert wide.edge_flags({"alpha": 0.5, "q": 0.5, "beta": 10.0}) == [], "inside both grids"


def test_consolidate_flags_its_alpha_in_report_table_and_card(tmp_path, tiny_model, tiny_tokenizer):
    """alphas 1,2: whichever the step search picks is an edge, so the run flags it everywhere."""
    from corp.methods.consolidate.run import run_consolidate

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    run = tmp_path / "run"
    cfg = tiny_consolidate_config(model_dir, run, reward="tests.test_consolidate:share_of_sevens", alphas="1,2")
    report = run_consolidate(cfg)
    alpha = next(c["alpha"] for c in report["corp"]["probe_table"] if c["candidate"] == report["corp"]["candidate"])
    (flag,) = [f for f in report["edge_flags"] if f["name"] == "alpha"]
    assert flag == {
        "name": "alpha",
        "chosen": alpha,
        "grid": [1.0, 2.0],
        "edge": "max" if alpha == 2.0 else "min",
        "option": "--alphas",
    }
    assert json.loads((run / "report.json").read_text())["edge_flags"] == report["edge_flags"]
    assert not [f for f in report["edge_flags"] if f["name"] == "top-1 sigma"], (
        "one sigma: no grid to be on the edge of"
    )
    line = edge_line(flag)
    assert line in report["table"], report["table"]
    card = (run / "model" / "README.md").read_text()
    assert "Searched values on the edge of their grid:" in card and f"- {line}." in card


def test_randopt_flags_a_top1_sigma_on_the_edge_of_the_population(tmp_path, tiny_dir):
    """Two noise scales: the top-1 specialist has one of them, the smallest or the largest."""
    from corp.config import RandOptConfig, load_config
    from corp.methods.randopt import run_randopt

    opts = dict(model=str(tiny_dir), task="arith", population=4, sigmas="0.01,0.05", n_support=4, n_test=4)
    opts.update(max_new_tokens=4, top_k="1", run_dir=str(tmp_path / "r"))
    report = run_randopt(load_config(RandOptConfig, None, opts))
    top1 = next(r for r in report["test"] if r["method"] == "randopt-top1")
    (flag,) = report["edge_flags"]
    assert flag["name"] == "top-1 sigma" and flag["grid"] == [0.01, 0.05] and flag["option"] == "--sigmas"
    assert flag["chosen"] == top1["sigma"] and flag["edge"] == ("max" if top1["sigma"] == 0.05 else "min")
    assert edge_line(flag) in report["table"]


def test_the_bench_flags_tuned_values_on_the_edge_of_their_search_grid():
    from types import SimpleNamespace

    from corp.bench.report.edges import edge_section
    from corp.bench.search import edge_flags

    space = {"learning_rate": [5e-5, 1e-5, 2e-5], "lora_r": [0, 16], "betas": [[10.0], [30.0]]}
    assert edge_flags(space, {"learning_rate": 2e-5, "lora_r": 16, "betas": [10.0]}) == [
        {"name": "betas", "chosen": [10.0], "grid": [[10.0], [30.0]], "edge": "min"},
        {"name": "lora_r", "chosen": 16, "grid": [0, 16], "edge": "max"},
    ]
    cfg = SimpleNamespace(methods={"grpo": {"search": space}}, label=lambda t: t)
    cell = {"task": "arith", "setting": "equal-data", "method": "grpo", "label": "grpo", "budget": 6e13, "rows": [{}]}
    tuned = {**cell, "tuning": {"chosen": {"learning_rate": 5e-5, "lora_r": 0, "betas": [30.0]}}}
    corp = {**cell, "method": "consolidate", "label": "corp", "detail": {"edge_flags": [edge_flag("alpha", 8, [1, 8])]}}
    lines = edge_section(cfg, [tuned, tuned, corp, {**corp, "detail": {}}])
    assert lines[0] == "## Searched values on the edge of their grid"
    assert "- tuning, grpo on arith at 6e+13: learning_rate = 5e-05 is the largest value searched (1e-05, 2e-05, " \
           "5e-05); a larger one may be better: add a larger value to its grid." in lines, lines  # fmt: skip
    assert sum(ln.startswith("- tuning, grpo on arith at 6e+13: lora_r = 0") for ln in lines) == 1, "once per cell"
    assert "- run, corp: alpha at its grid's max in 1 of 2 final cells." in lines
    assert edge_section(cfg, [cell]) == []


def test_a_value_chosen_outside_the_run_on_its_grids_edge_reaches_report_and_card(tmp_path, tiny_model, tiny_tokenizer):
    """corp bench's tuning chooses a run's options before the run, so the run cannot flag them itself: the
    bench states them (corp.grids.chosen_outside) and the run's report.json and model card carry them after
    its own flags; a run inside `chosen_outside(())` (the bench's shared population) carries none."""
    from corp.config import RandOptConfig, load_config
    from corp.grids import chosen_outside
    from corp.methods.consolidate.run import run_consolidate
    from corp.methods.randopt import run_randopt

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    tuned = {**edge_flag("betas", [30.0], [[10.0], [30.0]]), "by": "corp bench's tuning"}
    run = tmp_path / "run"
    cfg = tiny_consolidate_config(model_dir, run, reward="tests.test_consolidate:share_of_sevens", alphas="1,2")
    with chosen_outside([tuned]):
        report = run_consolidate(cfg)
        opts = dict(model=str(model_dir), task="arith", population=2, sigmas="0.01", n_support=4, n_test=4)
        with chosen_outside(()):
            shielded = run_randopt(load_config(RandOptConfig, None, {**opts, "run_dir": str(tmp_path / "pop")}))
    assert report["edge_flags"][-1] == tuned and report["edge_flags"][0]["name"] == "alpha", "the run's own first"
    assert json.loads((run / "report.json").read_text())["edge_flags"] == report["edge_flags"]
    line = edge_line(tuned)
    assert line.startswith("betas = 30 is the largest value searched by corp bench's tuning (10, 30)"), line
    assert f"- {line}." in (run / "model" / "README.md").read_text()
    assert not shielded.get("edge_flags"), "a shielded run carries no caller's flag"
    # outside any block, a run carries only its own
    plain = run_randopt(load_config(RandOptConfig, None, {**opts, "run_dir": str(tmp_path / "plain")}))
    assert not plain.get("edge_flags")
