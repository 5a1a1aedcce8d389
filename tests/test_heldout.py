"""Held-out pools (`heldout=START,dev=N`), `--report-on dev`, and the label prior (issue 39)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from corp.algorithms.stats import ratio_bootstrap_ci, wilson_interval
from corp.cli import app
from corp.errors import CorpError
from corp.evaluate.tasks import Example, SplitSizes, Task, dev_pool, get_task, label_prior, make_splits
from tests.conftest import make_char_tokenizer, make_tiny_llama


def test_heldout_keeps_the_earlier_pool_for_selection_and_holds_the_rest_out():
    plain = get_task("arith").pools()["train"]
    task = get_task("arith:pool=4600,heldout=4000,dev=100")
    pools = task.pools()
    # the selection pool is the earlier edition's pool, example for example
    assert [(e.id, e.prompt) for e in pools["train"]] == [(e.id, e.prompt) for e in plain]
    assert len(pools["dev"]) == 100 and len(pools["test"]) == 500
    train, dev, test = ({e.id for e in pools[k]} for k in ("train", "dev", "test"))
    assert not (train & dev or train & test or dev & test)
    assert {e.prompt for e in pools["test"]}.isdisjoint(e.prompt for e in plain)
    # held out = generated past the earlier pool's size
    assert all(int(i.split("-")[1]) >= 4000 for i in dev | test)
    sig = task.signature()
    assert sig["heldout"] == 4000 and sig["dev"] == 100
    assert "heldout" not in get_task("arith").signature()  # tasks without the options keep their signature
    # the test split comes from the held-out test pool whatever the other split sizes
    a = make_splits(task, SplitSizes(16, 64, 64, 200), 3)["test"]
    b = make_splits(task, SplitSizes(200, 0, 0, 200), 3)["test"]
    assert a == b and {e.id for e in a} <= test
    assert dev_pool(task) == pools["dev"]


def test_select_narrows_selection_and_keeps_the_set_aside_range_out_of_every_split():
    # the size claim's amendment: select on 0-3999, test past 6000, never touch 4000-5999 (an earlier
    # edition's held-out range); development and test pools must be exactly those without select=
    spec = "arith:digits=2,ops=+,pool=7600,heldout=6000,dev=400"
    plain, narrowed = get_task(spec), get_task(spec + ",select=4000")
    a, b = plain.pools(), narrowed.pools()
    assert b["dev"] == a["dev"] and b["test"] == a["test"]
    assert b["train"] == a["train"][:4000]
    splits = make_splits(narrowed, SplitSizes(1000, 1000, 1000, 400), 54)
    used = {int(e.id.split("-")[1]) for name in splits for e in splits[name]}
    used |= {int(e.id.split("-")[1]) for e in b["dev"]}
    assert used and not any(4000 <= i < 6000 for i in used)
    # with select= the 3000 selection examples above come from 4000, not 6000 (plant: without it they do not)
    wide = make_splits(plain, SplitSizes(1000, 1000, 1000, 400), 54)
    assert any(4000 <= int(e.id.split("-")[1]) < 6000 for e in wide["support"] + wide["probe"] + wide["validation"])
    assert narrowed.signature()["select"] == 4000 and "select" not in plain.signature()
    with pytest.raises(CorpError, match="exceeds heldout"):
        get_task(spec + ",select=6001")
    with pytest.raises(CorpError, match="heldout=START"):
        get_task("arith:select=10")


def test_select_refusal_names_the_fix_and_its_test_split_is_drawn_anew():
    # the refusal says what to give, not only what is wrong
    with pytest.raises(CorpError, match=r"exceeds heldout=6000.*give select=6000 or less"):
        get_task("arith:pool=7600,heldout=6000,dev=400,select=6001")
    # the test pool is the same with select=, but a split seed shuffles the (smaller) selection pool with the
    # same generator first, so it draws other test examples (heldout.py and docs/commands.md say so)
    spec, sizes = "arith:digits=2,ops=+,pool=7600,heldout=6000,dev=400", SplitSizes(64, 64, 64, 400)
    wide = {e.id for e in make_splits(get_task(spec), sizes, 54)["test"]}
    narrowed = {e.id for e in make_splits(get_task(spec + ",select=4000"), sizes, 54)["test"]}
    assert len(wide) == len(narrowed) == 400 and len(wide & narrowed) == 131


def test_heldout_options_refuse_what_they_cannot_do():
    with pytest.raises(CorpError, match="heldout=START"):
        get_task("arith:dev=10")
    with pytest.raises(CorpError, match="pool size"):
        get_task("arith:heldout=4000,dev=10").pools()
    with pytest.raises(CorpError, match="integer"):
        get_task("arith:heldout=-1")
    with pytest.raises(CorpError, match="development pool"):
        dev_pool(get_task("arith"), "arith")

    class OwnTest(Task):
        name = "own"

        def pools(self):
            ex = [Example(f"e{i}", "q", "a") for i in range(10)]
            return {"train": ex[:5], "test": ex[5:]}

    from corp.evaluate.tasks.heldout import apply_pool_options

    with pytest.raises(CorpError, match="test pool of its own"):
        apply_pool_options(OwnTest(), "own:heldout=2", {"heldout": 2}).pools()


def test_report_on_dev_reports_the_development_pool(tmp_path):
    tok = make_char_tokenizer()
    model_dir = tmp_path / "m"
    make_tiny_llama(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    spec = "arith:pool=4030,heldout=4000,dev=6"
    common = ["eval", "--model", str(model_dir), "--n-test", "4", "--n-support", "0", "--n-probe", "0"]
    common += ["--n-validation", "0", "--max-new-tokens", "2", "--backend", "hf", "--report-on", "dev"]
    res = CliRunner().invoke(app, [*common, "--task", spec, "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    splits = json.loads((tmp_path / "r" / "splits.json").read_text())
    assert splits["test"] == [e.id for e in dev_pool(get_task(spec))]
    assert splits["report_on"] == "dev"
    assert "6 dev problems" in res.output  # not "test problems": the test split was never scored
    res = CliRunner().invoke(app, [*common, "--task", "arith", "--run-dir", str(tmp_path / "r2")])
    assert res.exit_code != 0 and "heldout=START,dev=N" in res.output


def test_label_prior_finds_a_letters_like_prior():
    # the second edition's letters: 78% of the answers '1'
    exs = [Example(f"e{i}", "q", "1" if i < 78 else str(2 + i % 3)) for i in range(100)]
    task = Task()
    prior = label_prior(task, exs)
    assert prior["majority_answer"] == "1" and prior["majority_share"] == pytest.approx(0.78)
    assert prior["majority_accuracy"] == pytest.approx(0.78) and prior["distinct"] == 4
    lo, hi = prior["interval"]
    assert lo < 0.78 < hi
    # the accuracy is the task's own check: a check that accepts more than the gold string counts more
    lenient = Task()
    lenient.check = lambda answer, ex: answer is not None and answer in ("1", ex.answer) and ex.answer != "4"
    assert label_prior(lenient, exs)["majority_accuracy"] == pytest.approx(1 - sum(e.answer == "4" for e in exs) / 100)
    # ties go to the answer that sorts first, in every process
    assert label_prior(task, [Example("a", "q", "b"), Example("b", "q", "a")])["majority_answer"] == "a"
    with pytest.raises(CorpError):
        label_prior(task, [])


def test_arith_prior_is_low_on_the_fresh_test_split():
    task = get_task("arith:pool=6000,heldout=4000,dev=400")
    prior = label_prior(task, make_splits(task, SplitSizes(0, 0, 0, 600), 3)["test"])
    assert prior["majority_accuracy"] <= 0.1 and prior["n"] == 600


def test_wilson_and_ratio_intervals():
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and 0.1 < hi < 0.2  # not empty at 0 successes
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(1 - hi) and 0.39 < lo < 0.41
    bits, nbytes = [10.0, 12.0, 8.0, 11.0], [10, 10, 10, 10]
    lo, hi = ratio_bootstrap_ci(bits, nbytes)
    assert lo <= sum(bits) / sum(nbytes) <= hi
    # paired: the same units for both, a constant shift is exact
    lo, hi = ratio_bootstrap_ci([b + 1 for b in bits], nbytes, base_num=bits)
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
