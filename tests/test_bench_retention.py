"""`corp bench` with `retention: true` (issue 39): each finished final model scored off its task once,
kept beside the cell records, reported and plotted; `equivalence` entries as two one-sided tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats as sps

from corp.algorithms.stats import tost, tost_from
from corp.bench.config import BenchConfig
from corp.config import load_config
from corp.errors import CorpError
from tests.test_bench import tiny_options
from tests.test_methods import count_model_calls

OFF = "countdown:numbers=2,max=20"


def _options(tiny_dir, root, **over):
    opts = tiny_options(tiny_dir, root, name="ret", budgets=[2e8], settings=["paper"])
    opts["methods"] = {
        "self-consistency": {"options": {"k": [1, 2]}},
        "randopt": {"options": {"top_k": [1, 2]}},
        "consolidate": {"options": {"alphas": [1, 2], "gate_z": -10.0}, "variants": {"corp-stage1": {"rounds": 0}}},
        "es": {"options": {"population": 2, "sigma": 0.05, "alpha": 0.05}},
    }
    opts["compare"] = [["corp-stage1", "base"]]
    opts.update(retention=True, retention_tasks=[OFF], equivalence=[{"a": "corp-stage1", "b": "base", "margin": 0.5}])
    opts.update(over)
    return opts


@pytest.fixture(scope="module")
def retained(tiny_dir, tmp_path_factory):
    pytest.importorskip("reasoning_gym")
    import corp.evaluate.retention as ret
    from corp.bench.sweep import run_bench

    root = tmp_path_factory.mktemp("bench-ret")
    text, info = ret.retention_text()
    short = text[:2000]  # the story's first 2,000 characters: the same code on a fifteenth of the forward passes
    mp = pytest.MonkeyPatch()
    mp.setattr(ret, "retention_text", lambda path=None: (short, {**info, "bytes": len(short.encode())}))
    run_bench(load_config(BenchConfig, None, _options(tiny_dir, root)), "corp bench --config ret.yaml")
    out = root / "results" / "ret"
    files = sorted((out / "retention").glob("*.json"))
    stamps = {f.name: f.stat().st_mtime_ns for f in files}
    table = (out / "table.md").read_text()
    with count_model_calls() as again:
        run_bench(load_config(BenchConfig, None, _options(tiny_dir, root)), "corp bench --config ret.yaml")
    mp.undo()
    return {"root": root, "out": out, "files": files, "stamps": stamps, "again": dict(again), "table": table}


def _by_label(retained) -> dict:
    out = {}
    for f in retained["files"]:
        rec = json.loads(f.read_text())
        out.setdefault(rec["label"], []).append(rec)
    return out


@pytest.mark.slow
def test_every_finished_final_cell_gets_a_retention_record(retained):
    by = _by_label(retained)
    assert set(by) == {"self-consistency", "randopt", "corp-stage1", "es"}
    assert all(len(v) == 2 for v in by.values())  # both seeds
    for rec in by["corp-stage1"] + by["es"]:
        row = rec["rows"][rec["label"]]
        assert row["status"] == "scored", row
        assert math.isfinite(row["bpb"]["bpb"]) and row["bpb"]["bytes"] == row["text"]["bytes"]
        assert list(row["tasks"]) == [OFF] and row["tasks"][OFF]["n"] == 6
        assert "public domain" in row["text"]["license"] and row["flops"] > 0
    for rec in by["randopt"]:  # its top-1 rebuilt from (seed, sigma): a model of its own, not the base
        top1 = rec["rows"]["randopt-top1"]
        assert top1["status"] == "scored" and "rebuilt" in top1["model"] and top1["bpb_change"]["delta"] != 0.0
        assert rec["rows"]["randopt-vote@2"]["status"] == "n/a"
        assert "not one model" in rec["rows"]["randopt-vote@2"]["reason"]
    for rec in by["self-consistency"]:
        assert "not one model" in rec["rows"]["self-consistency@2"]["reason"]


def _watch(monkeypatch, event) -> list:
    """The bench's order of events, as a list it fills: ("cell", record name) as a final cell finishes, and
    event(name, record) for each record handed to retention scoring (which then scores nothing)."""
    import corp.bench.schedule.passes as passes
    import corp.bench.sweep as sweep

    events = []
    real_attempt = passes.attempt

    def attempt(bench, cell):
        rec = real_attempt(bench, cell)
        if rec is not None and cell.setting != "tune":
            events.append(("cell", cell.record_name()))
        return rec

    def score(cfg, done, scorer=None):
        events.extend(event(name, rec) for name, rec in done.items())
        return 0

    monkeypatch.setattr(passes, "attempt", attempt)
    monkeypatch.setattr(passes, "score_records", score)  # each cell's, as a pass sees it
    monkeypatch.setattr(sweep, "score_records", score)  # the rest, after the passes
    return events


def test_each_final_cell_is_scored_off_task_before_the_next_cell_runs(tiny_dir, tmp_path, monkeypatch):
    """A long bench spans sessions, and a later session has none of an earlier one's run directories
    (models are never committed): scoring every model after the last cell found them gone. The
    planted case: the order of events; each final cell's retention must come right after it."""
    from corp.bench.sweep import run_bench

    def model_there(name, rec):
        return ("retention", name, rec["method"] != "es" or (Path(rec.get("run_dir") or "") / "model").is_dir())

    events = _watch(monkeypatch, model_there)
    opts = _options(tiny_dir, tmp_path, methods={"es": {"options": {"population": 2, "sigma": 0.05, "alpha": 0.05}}})
    opts.update(compare=[], equivalence=[])
    run_bench(load_config(BenchConfig, None, opts), "corp bench --config ret.yaml")
    cells = [i for i, e in enumerate(events) if e[0] == "cell"]
    assert len(cells) >= 2
    for i in cells:
        assert events[i + 1][:2] == ("retention", events[i][1]) and events[i + 1][2], events


def test_a_cell_an_earlier_start_left_unscored_is_scored_when_first_seen(tiny_dir, tmp_path, monkeypatch):
    """A start that stops (SIGTERM at a session's end) right after a cell's record is written leaves it
    unscored; the next start scored it only after all its passes, which a session that stops again never
    reaches, so the cell's model could outlive every session's chance to score it. Planted: a first start
    that scores nothing, then one final record removed so the second start has a cell to run; every
    finished cell must be scored before that cell runs."""
    import corp.bench.schedule.passes as passes
    import corp.bench.sweep as sweep
    from corp.bench.sweep import run_bench

    opts = _options(tiny_dir, tmp_path, methods={"randopt": {"options": {"top_k": [1]}}})
    opts.update(compare=[], equivalence=[])
    cfg = load_config(BenchConfig, None, opts)
    monkeypatch.setattr(passes, "score_records", lambda *a, **k: 0)  # the first start scores nothing
    monkeypatch.setattr(sweep, "score_records", lambda *a, **k: 0)
    run_bench(cfg, "corp bench --config ret.yaml")
    cells_dir = tmp_path / "results" / "ret" / "cells"
    finals = sorted(f for f in cells_dir.glob("*.json") if json.loads(f.read_text())["setting"] != "tune")
    assert len(finals) >= 2, finals
    last = max(finals, key=lambda f: f.stat().st_mtime_ns)  # the plan's last final: the others come before it
    last.unlink()

    events = _watch(monkeypatch, lambda name, rec: ("retention", name))
    run_bench(cfg, "corp bench --config ret.yaml")
    ran = [i for i, e in enumerate(events) if e[0] == "cell"]
    assert [events[i][1] for i in ran] == [last.name], events
    before = {e[1] for e in events[: ran[0]]}
    assert {f.name for f in finals if f != last} <= before, events


def test_a_cell_whose_run_is_on_another_machine_is_left_unscored_not_marked_na(tmp_path):
    """A later session's fresh checkout resumes a bench whose last cell ended before its retention was
    scored: the cell's run directory (git-ignored) is on the machine that ran it. Planted: a CoRP record and
    a RandOpt record whose run and population directories are not here. Neither may get a record (an n/a
    written then would stand for good); the report counts both as not scored yet. A run directory that is
    here but holds no model is still an n/a record (the control)."""
    from corp.bench import retention

    cfg = load_config(BenchConfig, None, _options(tmp_path / "model", tmp_path))
    head = {"task": cfg.tasks[0], "setting": "paper", "seed": 1, "budget": 2e8, "status": "done"}
    gone = tmp_path / "elsewhere"
    records = {
        "corp.json": {
            **head,
            "method": "consolidate",
            "label": "corp-stage1",
            "run_dir": str(gone / "corp"),
            "rows": [{"name": "corp-stage1", "passes_per_example": 1}],
        },
        "randopt.json": {
            **head,
            "method": "randopt",
            "label": "randopt",
            "run_dir": str(gone / "r"),
            "population_run": str(gone / "pop"),
            "rows": [{"name": "randopt-top1", "passes_per_example": 1}],
        },
    }
    with pytest.warns(UserWarning, match="not on this machine") as caught:
        assert retention.score_records(cfg, records, scorer=lambda *a: pytest.fail("nothing may be scored")) == 0
    assert len(caught) == 2 and all("\n" not in str(w.message) for w in caught)
    assert not (Path(cfg.results_dir) / cfg.name / "retention").exists()
    assert retention.unscored(cfg, list(records.values()), []) == 2
    text = "\n".join(retention.section(cfg, [], 2))
    assert "Not scored yet: 2 final cell(s)" in text
    here = tmp_path / "here"
    here.mkdir()
    control = {**records["corp.json"], "run_dir": str(here)}
    assert retention.score_records(cfg, {"control.json": control}) == 1
    rec = json.loads((Path(cfg.results_dir) / cfg.name / "retention" / "control.json").read_text())
    assert rec["rows"]["corp-stage1"] == {"status": "n/a", "reason": f"no saved model in '{here}'"}


@pytest.mark.slow
def test_the_base_scored_as_a_method_changes_by_exactly_zero(retained):
    """The planted case: the base row's model is the base, so every change is exactly 0, not about 0."""
    for rec in _by_label(retained)["self-consistency"]:
        row = rec["rows"]["base"]
        assert row["status"] == "scored"
        assert row["bpb_change"]["delta"] == 0.0 and row["bpb_change"]["interval"] == [0.0, 0.0]
        assert row["tasks"][OFF]["change"] == 0.0 and row["tasks"][OFF]["correct"] == row["tasks"][OFF]["base_correct"]
    assert (
        "| add | base | +0.000 [+0.000, +0.000] | +0.0000 [+0.0000, +0.0000] | +0.000 [+0.000, +0.000] |"
        in (retained["table"])
    )


@pytest.mark.slow
def test_a_rerun_scores_nothing_again(retained):
    assert retained["again"] == {"generate": 0, "forward": 0}
    assert {f.name: f.stat().st_mtime_ns for f in retained["files"]} == retained["stamps"]


@pytest.mark.slow
def test_the_table_and_the_plot_show_retention_and_report_only_regenerates_them(retained, tiny_dir):
    from corp.bench.sweep import run_bench

    out, table = retained["out"], retained["table"]
    assert "## Off-task retention" in table and "bits/byte change" in table and f"{OFF} accuracy change" in table
    assert "n/a — not one model" in table
    meta = json.loads((out / "bench.json").read_text())
    assert "retention__add__paper.png" in meta["plots"] and (out / "retention__add__paper.png").stat().st_size > 0
    assert {e["name"] for e in meta["retention"]} >= {"base", "corp-stage1", "es"}
    assert "## Equivalence (two one-sided tests" in table and "corp-stage1 vs base" in table
    run_bench(
        load_config(BenchConfig, None, _options(tiny_dir, retained["root"])),
        "corp bench --config ret.yaml",
        True,
        False,
    )
    assert (out / "table.md").read_text() == table


@pytest.mark.slow
def test_the_readme_section_states_what_each_model_costs_off_its_task(retained, tiny_dir):
    """The README's section carries the retention table's numbers for every scored single model (not the
    base, not a vote): its bits-per-byte change and its accuracy change on the other task, with intervals."""
    from corp.bench.report import readme_section
    from corp.bench.retention import _iv

    cfg = load_config(BenchConfig, None, _options(tiny_dir, retained["root"]))
    para = next(line for line in readme_section(cfg).splitlines() if line.startswith("Off its task"))
    meta = json.loads((retained["out"] / "bench.json").read_text())
    scored = [e for e in meta["retention"] if "na" not in e and e["name"] != "base"]
    assert {e["name"] for e in scored} >= {"corp-stage1", "es"}
    for e in scored:
        assert f"{e['name']} on add: bits/byte {_iv(e['bpb'], 4)}, {OFF} accuracy {_iv(e['tasks'][OFF])}" in para
    assert "base on add" not in para and "@2 on add" not in para


def test_the_readme_bounds_each_cost_and_says_a_seed_can_still_be_worse():
    """Issue 55: the README said "no off-task cost shown" whenever every pooled interval included 0, though one
    seed's model had a cost. Planted: two methods whose intervals include 0: the paragraph states each one's
    upper bound, says one seed can still be worse, and never "no off-task cost"; one above 0 is named worse."""
    from corp.bench.retention import readme_lines

    cfg = load_config(BenchConfig, None, {"tasks": [{"task": "arith", "label": "add"}], "methods": {"randopt": {}}})

    def entry(name, lo, hi):
        return {"name": name, "task": "arith", "bpb": {"mean": (lo + hi) / 2, "ci": [lo, hi], "seeds": 3}}

    (para,) = readme_lines(cfg, [entry("corp-stage1", -0.0079, 0.0135), entry("randopt-top1", -0.0016, 0.0051)])
    assert "corp-stage1 +0.0135, randopt-top1 +0.0051" in para and "97.5% confidence" in para, para
    assert "one seed's model can still be worse" in para and "no off-task cost" not in para, para
    (worse,) = readme_lines(cfg, [entry("es", 0.001, 0.004)])
    assert "worse than the base (the interval above 0): es" in worse, worse


def test_only_a_row_that_is_one_model_of_this_budget_is_scored(tmp_path):
    """An iterative run whose saved model was trained past the cell's budget is n/a, not scored as the cell."""
    from corp.bench.retention import target

    cfg = load_config(BenchConfig, None, {"name": "x", "model": "base-model", "methods": {"es": {}}})
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "report.json").write_text(json.dumps({"iterations": 5}))
    rec = {"method": "es", "units": 3, "run_dir": str(run)}
    model, why = target(cfg, rec, {"name": "es", "passes_per_example": 1})
    assert model is None and "past this budget" in why and "5" in why and "3" in why
    rec["units"] = 5
    assert target(cfg, rec, {"name": "es", "passes_per_example": 1})[0] == str(run / "model")
    assert target(cfg, rec, {"name": "base", "passes_per_example": 1})[0] == "base-model"
    assert target(cfg, {"method": "randopt"}, {"name": "randopt-vote@4", "passes_per_example": 4})[0] is None


def test_tost_by_hand():
    # diffs 0.01, 0.02, 0.03: mean 0.02, sd 0.01, se 0.01/sqrt(3), df 2; against +0.05 the t is
    # 0.03 / se = 3 sqrt(3), and with 2 df the t tail is 0.5 (1 - t / sqrt(t^2 + 2)) = 0.5 (1 - 3 sqrt(3) / sqrt(29))
    r = tost([0.01, 0.02, 0.03], 0.05)
    assert r["p_upper"] == pytest.approx(0.5 * (1 - 3 * math.sqrt(3) / math.sqrt(29)), rel=1e-9)
    t_low = 0.07 / (0.01 / math.sqrt(3))
    assert r["p_lower"] == pytest.approx(0.5 * (1 - t_low / math.sqrt(t_low**2 + 2)), rel=1e-9)
    assert r["p"] == r["p_upper"] and r["equivalent"]  # 0.0175 <= 0.05
    half = sps.t.ppf(0.95, 2) * 0.01 / math.sqrt(3)
    assert r["ci"] == pytest.approx((0.02 - half, 0.02 + half))
    # a margin the 90% interval crosses is not shown equivalent; the test is symmetric in sign
    assert not tost([0.01, 0.02, 0.03], 0.03)["equivalent"]
    assert tost([-0.01, -0.02, -0.03], 0.05)["p"] == pytest.approx(r["p"])
    assert tost_from(0.0, 0.0, 2, 0.03)["equivalent"] and not tost_from(0.04, 0.0, 2, 0.03)["equivalent"]
    with pytest.raises(ValueError):
        tost([0.1], 0.05)


@pytest.mark.parametrize(
    "over, names",
    [
        ({"equivalence": [{"a": "x", "b": "y", "margin": 2}]}, "margin"),
        ({"equivalence": [{"a": "x", "b": "y"}]}, "margin"),
        ({"retention_tasks": ["arith"]}, "retention: true"),
        ({"retention": "yes"}, "retention"),
    ],
)
def test_bad_retention_and_equivalence_fields_are_one_line(over, names, tmp_path):
    opts = {"name": "x", "methods": {"randopt": {}}, **over}
    with pytest.raises(CorpError, match=names):
        load_config(BenchConfig, None, opts)


def test_a_retention_record_scored_on_other_texts_is_refused_not_mixed_in(tmp_path):
    """Planted: a record scored on the default text alone (as every record before `retention_texts`, which
    names no text) read by a bench whose config pools two texts: report-only and scoring both refuse it."""
    from corp.bench import retention as br

    extra = tmp_path / "extra.txt"
    extra.write_text("A second text.\n")
    cfg = load_config(
        BenchConfig,
        None,
        {
            "methods": {"randopt": None},
            "retention": True,
            "retention_texts": ["verne-2889", str(extra)],
            "results_dir": str(tmp_path),
        },
    )
    old_row = {"status": "scored", "text": {"title": "t", "license": "l", "source": "s", "bytes": 1, "sha256": "x"}}
    rec = {
        "task": "arith",
        "setting": "paper",
        "seed": 0,
        "label": "corp-stage1",
        "budget": 1.0,
        "rows": {"a": old_row},
    }
    assert br.record_texts(rec) == ["verne-2889"]
    path = br.retention_file(cfg, "cell.json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))
    with pytest.raises(CorpError, match="scored on verne-2889, the config says retention_texts verne-2889,"):
        br.load_records(cfg, [rec])
    with pytest.raises(CorpError, match="move RESULTS_DIR/NAME/retention aside"):
        br.score_records(cfg, {"cell.json": {**rec, "rows": []}}, scorer=lambda *a: pytest.fail("scored again"))
    same = load_config(
        BenchConfig, None, {"methods": {"randopt": None}, "retention": True, "results_dir": str(tmp_path)}
    )  # the default text
    assert br.load_records(same, [rec]) == [rec]


def test_retention_texts_without_retention_or_missing_are_one_line_when_the_config_loads(tmp_path):
    with pytest.raises(CorpError, match="retention_texts applies with retention: true"):
        load_config(BenchConfig, None, {"methods": {"randopt": None}, "retention_texts": ["verne-2889", "jargon-file"]})
    with pytest.raises(CorpError, match="neither one of corp's texts"):
        load_config(BenchConfig, None, {"methods": {"randopt": None}, "retention": True, "retention_texts": ["nope"]})
