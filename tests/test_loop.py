"""The loop iterative methods share (corp/runtime/loop.py): resume, checkpoints, the metrics log, a
non-finite metric, other loops' rows in the same log. A toy method: a counter whose state is saved
to a JSON file, its step adds t + 1."""

from __future__ import annotations

import json

import pytest

from corp.errors import CorpError
from corp.runtime.loop import Steps, method_rows, run_steps
from corp.runtime.runs import append_jsonl, read_jsonl


class Ctx:
    """What run_steps needs of a run's context: log_row (writes the row; --report-to would see it)."""

    def __init__(self):
        self.live = []

    def log_row(self, path, row):
        append_jsonl(path, row)
        self.live.append(row)


class Counter(Steps):
    desc, unit, key = "toy", "step", "step"

    def __init__(self, run_dir, total, every=1, crash_at=None, nan_at=None, arm="a"):
        self.state_path = run_dir / "state.json"
        self.metrics_path = run_dir / "metrics.jsonl"
        self.total, self.checkpoint_every = total, every
        self.crash_at, self.nan_at, self.arm = crash_at, nan_at, arm
        self.finite = ("loss",)
        self.finite_hint = "lower --learning-rate"
        self.value, self.done, self.steps_taken = 0, 0, []

    def mine(self, row):
        return row["arm"] == self.arm

    def resume(self):
        if self.state_path.exists():
            st = json.loads(self.state_path.read_text())
            self.value, self.done = st["value"], st["done"]
        return self.done

    def step(self, t):
        if t == self.crash_at:
            raise KeyboardInterrupt
        self.steps_taken.append(t)
        self.value += t + 1
        self.done = t + 1
        return {"arm": self.arm, "step": t + 1, "value": self.value, "loss": float("nan") if t == self.nan_at else 0.5}

    def save(self):
        self.state_path.write_text(json.dumps({"value": self.value, "done": self.done}))


def test_a_fresh_run_logs_every_step_and_saves_at_the_end(tmp_path):
    ctx, loop = Ctx(), Counter(tmp_path, 4, every=3)
    rows = run_steps(ctx, loop)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert read_jsonl(loop.metrics_path) == rows == ctx.live
    assert json.loads(loop.state_path.read_text()) == {"value": 10, "done": 4}  # saved at 3 and at the last step


def test_rows_past_the_saved_state_are_redone_not_doubled(tmp_path):
    # checkpoint every 2 steps, killed in step 3 (0-based t=3 is the 4th step): rows 1-3 were logged,
    # the state holds 2 steps; the resumed run drops row 3 and redoes steps 3 and 4
    with pytest.raises(KeyboardInterrupt):
        run_steps(Ctx(), Counter(tmp_path, 4, every=2, crash_at=3))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    loop = Counter(tmp_path, 4, every=2)
    rows = run_steps(Ctx(), loop)
    assert loop.steps_taken == [2, 3]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["step"] for r in read_jsonl(loop.metrics_path)] == [1, 2, 3, 4]
    assert rows[-1]["value"] == 10  # the same counter as an uninterrupted run


def test_a_longer_rerun_continues_and_a_finished_one_does_nothing(tmp_path):
    run_steps(Ctx(), Counter(tmp_path, 2))
    again = Counter(tmp_path, 2)
    assert [r["step"] for r in run_steps(Ctx(), again)] == [1, 2] and again.steps_taken == []
    longer = Counter(tmp_path, 3)
    assert [r["step"] for r in run_steps(Ctx(), longer)] == [1, 2, 3] and longer.steps_taken == [2]


def test_other_loops_rows_in_the_same_log_are_left_alone(tmp_path):
    # another arm's rows past this arm's state are not this loop's to drop
    for step in (1, 2, 3):
        append_jsonl(tmp_path / "metrics.jsonl", {"arm": "b", "step": step, "value": 0, "loss": 0.0})
    rows = run_steps(Ctx(), Counter(tmp_path, 1))
    assert [r["arm"] for r in rows] == ["a"]
    assert [(r["arm"], r["step"]) for r in read_jsonl(tmp_path / "metrics.jsonl")] == [
        ("b", 1),
        ("b", 2),
        ("b", 3),
        ("a", 1),
    ]


def test_a_non_finite_metric_stops_the_run_in_one_line_naming_the_fix(tmp_path):
    with pytest.raises(CorpError, match=r"step 2: the loss .*non-finite.*--learning-rate"):
        run_steps(Ctx(), Counter(tmp_path, 3, nan_at=1))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]  # the bad row is never logged


def test_method_rows_leave_out_a_skipped_evaluation_and_charge_each_its_own_tokens():
    r = {"accuracy": 0.5, "prompt_tokens": 10, "generated_tokens": 5, "correct": [1, 0]}
    rows = method_rows(100, "es", dict(r), dict(r, accuracy=1.0, correct=[1, 1]), 8, ["a-1", "a-2"], {"iterations": 2})
    assert [(x.method, x.accuracy, x.labelled_examples, x.detail) for x in rows] == [
        ("base", 0.5, 0, {}),
        ("es", 1.0, 8, {"iterations": 2}),
    ]
    assert rows[0].ledger.flops == 2 * 100 * 15
    assert [x.method for x in method_rows(100, "grpo", None, r, 8, ["a-1", "a-2"])] == ["grpo"]


# ---------------------------------------------------------------- finish: what every iterative method writes


class RunCtx:
    """What `finish` needs of a run's context: its directory, the command's name, its config and measure."""

    def __init__(self, run_dir):
        from types import SimpleNamespace

        self.run_dir, self.method, self.measure = run_dir, "toy", "accuracy"
        self.cfg = SimpleNamespace(model="tiny", task="arith")


def _outputs(**kw):
    from corp.runtime.ledger import Ledger
    from corp.runtime.loop import Outputs

    r = {"accuracy": 0.5, "prompt_tokens": 10, "generated_tokens": 5, "correct": [1, 0]}
    rows = method_rows(100, "toy", r, dict(r, accuracy=1.0, correct=[1, 1]), 8, ["a-1", "a-2"])
    return Outputs(rows, [("toy", "base")], ["a-1", "a-2"], {"steps": 2}, Ledger(100, 40, 20, 30), **kw)


def _recipe():
    from corp.algorithms.perturb import Component, Direction, ParamFilter
    from corp.algorithms.recipe import make_recipe

    direction = Direction([Component(3, 0.5)])
    return make_recipe("tiny", "tiny-id", "0" * 16, ParamFilter(".*", ""), direction, {"method": "toy"})


def test_finish_writes_recipe_model_and_a_report_naming_both(tmp_path):
    from corp.runtime.loop import finish
    from tests.conftest import make_char_tokenizer, make_tiny_llama

    tok = make_char_tokenizer()
    seen = {}

    def notes(report):  # sees the report as written, the recipe's measured size in it
        seen.update(report)
        return ["a note"]

    rep = finish(RunCtx(tmp_path), _outputs(model=(make_tiny_llama(tok), tok), recipe=_recipe(), notes=notes))
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["model_dir"] == str(tmp_path / "model") and (tmp_path / "model" / "config.json").exists()
    assert on_disk["recipe"] == str(tmp_path / "recipe.json")
    assert on_disk["recipe_bytes"] == (tmp_path / "recipe.json").stat().st_size == seen["recipe_bytes"] > 0
    assert json.loads((tmp_path / "recipe.json").read_text())["components"] == [{"seed": 3, "sigma": 0.5, "coef": 1.0}]
    assert on_disk["training_ledger"]["flops"] == rep["training_ledger"]["flops"] > 0
    assert [c["a"] + "-" + c["b"] for c in on_disk["comparisons"]] == ["toy-base"]
    assert rep["table"].splitlines()[-1] == "a note" and "toy" in rep["table"]


def test_finish_writes_no_report_when_the_model_could_not_be_saved(tmp_path, monkeypatch):
    """The report comes last: a run stopped while saving its model leaves no report naming it."""
    import corp.runtime.loop
    from corp.runtime.loop import finish

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(corp.runtime.loop, "save_model", full_disk)
    with pytest.raises(OSError):
        finish(RunCtx(tmp_path), _outputs(model=(object(), object()), recipe=_recipe()))
    assert (tmp_path / "recipe.json").exists() and not (tmp_path / "report.json").exists()


def test_finish_a_federated_ledger_states_its_flops_beside_it_and_a_run_without_test_rows_has_no_table(tmp_path):
    from corp.runtime.loop import finish

    out = _outputs(ledger_field="method_ledger")
    out.rows, out.compare, out.ids = [], [], None
    rep = finish(RunCtx(tmp_path), out)
    assert rep["method_flops"] == rep["method_ledger"]["flops"] > 0 and "training_ledger" not in rep
    assert "table" not in rep and "model_dir" not in rep and "recipe" not in rep
    with pytest.raises(ValueError, match="ledger_field"):
        finish(RunCtx(tmp_path), _outputs(ledger_field="ledger"))


def test_finish_shown_fields_stay_out_of_report_json_and_a_run_without_report_writes_only_its_exports(tmp_path):
    """eval's retention is in the returned report but only in its own file; analyze-rank's report is its
    own summary file, which an export writes: finish writes no report.json and returns the fields."""
    from corp.runtime.loop import Outputs, finish

    rep = finish(RunCtx(tmp_path), _outputs(shown={"retention": {"format": 1}}))
    assert rep["retention"] == {"format": 1} and "retention" not in json.loads((tmp_path / "report.json").read_text())

    summary = tmp_path / "summary"
    summary.mkdir()
    out = Outputs([], [], None, {"n": 3}, exports=[lambda d: (d / "rank_summary.json").write_text("{}")], report=False)
    assert finish(RunCtx(summary), out) == {"n": 3}
    assert sorted(p.name for p in summary.iterdir()) == ["rank_summary.json"]
    with pytest.raises(ValueError, match="report=True"):
        finish(RunCtx(summary), _outputs(report=False))
