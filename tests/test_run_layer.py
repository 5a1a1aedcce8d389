"""The run layer on a tiny model: one evaluation cache keyed by exactly what was evaluated, run
metadata that refuses a mixed population before writing anything, failed runs, --from-run, reports."""

from __future__ import annotations

import json

import pytest

from corp.errors import CorpError
from corp.evaluate.scorer import ensure_population
from corp.runtime.context import EvalCache, open_run, run_evals, setup_run
from corp.runtime.runs import read_jsonl
from tests.test_scorer import fresh_backend, tiny_cfg


def counting(backend):
    calls = []
    real = backend.generate
    backend.generate = lambda prompts, *a, **k: (calls.append(len(prompts)), real(prompts, *a, **k))[1]
    return backend, calls


def test_validation_base_row_is_not_reused_for_other_validation_examples(tmp_path):
    """Issue 10, defect 1: another --n-probe keeps support/test ids but changes every validation
    example; the cached validation|base row must not be paired with the new examples."""
    from corp.methods.consolidate.run import RunScorer

    cfg1 = tiny_cfg(tmp_path, n_probe=2, n_validation=3)
    ctx1 = setup_run(cfg1, "consolidate", fresh_backend(), needs=("support", "validation"))
    first = RunScorer(ctx1, run_evals(ctx1))(None, "validation")
    ctx1.close()

    cfg2 = tiny_cfg(tmp_path, n_probe=4, n_validation=3)
    backend, calls = counting(fresh_backend())
    ctx2 = setup_run(cfg2, "consolidate", backend, needs=("support", "validation"))
    assert ctx2.example_ids("support") == ctx1.example_ids("support") and ctx2.example_ids("test") == ctx1.example_ids(
        "test"
    )
    assert ctx2.example_ids("validation") != ctx1.example_ids("validation"), (
        "the planted case: only the validation examples moved"
    )
    scorer = RunScorer(ctx2, run_evals(ctx2))
    second = scorer(None, "validation")
    assert calls == [3], "the base is evaluated again, on the new validation examples"
    assert second.example_ids == ctx2.example_ids("validation") != first.example_ids
    assert scorer.example_ids(None, "validation") == ctx2.example_ids("validation")
    calls.clear()
    assert scorer(None, "validation") == second and calls == [], "and cached from then on"


def test_cache_key_covers_examples_weights_and_generation_settings(tmp_path):
    from corp.runtime.context import cached_eval

    backend, calls = counting(fresh_backend())
    ctx = setup_run(tiny_cfg(tmp_path), "randopt", backend)
    cache = run_evals(ctx)
    row = cached_eval(ctx, cache, "test", None)
    cached_eval(ctx, cache, "test", None)
    assert len(calls) == 1
    cached_eval(ctx, cache, "test", None, examples=ctx.splits["test"][:3])  # other examples: another key
    cached_eval(ctx, cache, "test", None, n=2, temperature=1.0)  # other generation settings: another key
    assert len(calls) == 3
    other = EvalCache(ctx.run_dir / "evals.jsonl")
    assert len(other) == 3 and row["key"] in other
    ctx.cfg.max_new_tokens = 3  # another generation length
    cached_eval(ctx, cache, "test", None)
    assert len(calls) == 4


def snapshot(run_dir):
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != ".corp.lock"}


@pytest.mark.parametrize("change", [{"sigmas": "0.05,0.2"}, {"seed": 1}, {"exclude": "lm_head"}, {"max_new_tokens": 5}])
def test_resume_with_other_population_settings_is_refused_before_writing(tmp_path, change):
    run = tmp_path / "r"
    ctx = setup_run(tiny_cfg(run), "randopt", fresh_backend())
    ensure_population(ctx)
    ctx.close()
    before = snapshot(run)
    with pytest.raises(CorpError, match="use another --output-dir"):
        setup_run(tiny_cfg(run, **change), "randopt", fresh_backend())
    assert snapshot(run) == before, "config.yaml, splits.json and the rows are untouched"
    assert len(read_jsonl(run / "population.jsonl", key="key")) == 4


def test_population_with_duplicate_rows_counts_each_specialist_once(tmp_path):
    run = tmp_path / "r"
    ctx = setup_run(tiny_cfg(run), "randopt", fresh_backend())
    ensure_population(ctx)
    path = run / "population.jsonl"
    path.write_text(path.read_text() * 2)  # what two writers without a lock left behind
    assert len(ensure_population(ctx)) == 4


def test_from_run_takes_the_first_n_in_population_order(tmp_path):
    src = tmp_path / "src"
    ctx = setup_run(tiny_cfg(src, population=4), "randopt", fresh_backend())
    rows = ensure_population(ctx)
    ctx.close()
    by_index = sorted(rows, key=lambda r: r["index"])
    # a resumed Ray population writes rows as they complete: put them out of order on disk
    path = src / "population.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(reversed(lines)) + "\n")
    cfg = tiny_cfg(tmp_path / "dst", population=2, top_k="1,2", from_run=str(src))
    with pytest.warns(UserWarning, match="using the 2 first in population order"):
        ctx2 = setup_run(cfg, "randopt", fresh_backend())
        got = ensure_population(ctx2)
    assert sorted(r["seed"] for r in got) == sorted(r["seed"] for r in by_index[:2])
    assert ctx2.population_source["available"] == 4 and ctx2.population_source["used"] == 2


def test_from_run_refuses_an_es_run(tmp_path):
    from corp.methods.es import run_es
    from tests.test_es import tiny_es_cfg

    run_es(tiny_es_cfg(tmp_path / "es", iterations=1, population=2, reward=None), fresh_backend())
    cfg = tiny_cfg(tmp_path / "dst", population=2, top_k="1", from_run=str(tmp_path / "es"))
    with pytest.raises(CorpError, match="kind 'es', not a population"):
        ensure_population(setup_run(cfg, "randopt", fresh_backend()))


def test_failed_run_before_computing_anything_leaves_no_directory(tmp_path):
    run = tmp_path / "new"
    with pytest.raises(CorpError, match="model"):
        with open_run(tiny_cfg(run), "randopt", fresh_backend()):
            raise CorpError("model 'x' not found")
    assert not run.exists()


def test_failed_run_after_scoring_is_marked_and_resumes(tmp_path):
    run = tmp_path / "r"
    with pytest.raises(RuntimeError):
        with open_run(tiny_cfg(run), "randopt", fresh_backend()) as ctx:
            ensure_population(ctx)
            raise RuntimeError("disk full")
    assert "disk full" in (run / "FAILED").read_text()
    assert json.loads((run / "run_status.json").read_text())["status"] == "failed"
    from corp.methods.randopt import run_randopt

    run_randopt(tiny_cfg(run), fresh_backend())
    assert not (run / "FAILED").exists() and json.loads((run / "run_status.json").read_text())["status"] == "complete"


def test_randopt_report_has_paired_comparisons_outcomes_and_labelled_counts(tmp_path):
    from corp.methods.randopt import run_randopt

    report = run_randopt(tiny_cfg(tmp_path / "r"), fresh_backend())
    rows = {r["method"]: r for r in report["rows"]}
    assert (
        rows["base"]["labelled_examples"] == 0
        and rows["randopt-top1"]["labelled_examples"] == 6 == rows["randopt-vote@2"]["labelled_examples"]
    )
    pairs = {(c["a"], c["b"]) for c in report["comparisons"]}
    assert pairs == {("randopt-top1", "base"), ("randopt-vote@2", "base")}
    for c in report["comparisons"]:
        assert c["n"] == 6 and c["ci95"][0] <= c["difference"] <= c["ci95"][1] and 0 <= c["mcnemar_p"] <= 1
    outcomes = json.loads((tmp_path / "r" / "test_outcomes.json").read_text())
    assert set(outcomes["outcomes"]) == set(rows) and len(outcomes["example_ids"]) == 6
    assert sum(outcomes["outcomes"]["randopt-vote@2"]) / 6 == pytest.approx(rows["randopt-vote@2"]["accuracy"])
    assert "McNemar p" in report["table"]
    assert json.loads((tmp_path / "r" / "report.json").read_text())["schema"] == "corp-report/1"


def test_es_report_compares_with_base_and_counts_support(tmp_path):
    from corp.methods.es import run_es
    from tests.test_es import tiny_es_cfg

    report = run_es(tiny_es_cfg(tmp_path / "es", iterations=1, population=2), fresh_backend())
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["es"]["labelled_examples"] == 6 and rows["base"]["labelled_examples"] == 0
    assert [(c["a"], c["b"]) for c in report["comparisons"]] == [("es", "base")]


def test_sigterm_during_a_run_is_recorded_as_interrupted(tmp_path):
    import signal
    import subprocess
    import sys

    run = tmp_path / "r"
    code = f"""
import time
from corp.config import RandOptConfig, load_config
from corp.runtime.context import open_run
from corp.runtime.runs import append_jsonl
cfg = load_config(RandOptConfig, None, dict(task="arith", population=2, sigmas="0.1", n_support=2, n_test=2, top_k="1", run_dir={str(run)!r}))
with open_run(cfg, "randopt") as ctx:
    append_jsonl(ctx.run_dir / "population.jsonl", {{"key": "x"}})
    print("scoring", flush=True)
    time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "scoring"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert json.loads((run / "run_status.json").read_text())["status"] == "interrupted"
    assert "was interrupted" in (run / "FAILED").read_text()


def test_shared_eval_cache_serves_other_runs_only_for_the_same_weights(tmp_path):
    """--eval-cache (corp bench: one per task): a second run dir reuses the base's and a
    specialist's greedy test rows, but not a sampled row, not a trained checkpoint's label, and not
    a direction perturbing other parameters (the run key leaves include/exclude implicit)."""
    from corp.algorithms.perturb import Direction
    from corp.runtime.context import cached_eval

    shared = tmp_path / "shared.jsonl"
    spec = Direction.single(7, 0.05)

    def run(name, **kw):
        backend, calls = counting(fresh_backend())
        ctx = setup_run(tiny_cfg(tmp_path / name, eval_cache=str(shared), **kw), "randopt", backend)
        return ctx, run_evals(ctx), calls

    ctx, cache, calls = run("a")
    base_row = cached_eval(ctx, cache, "test", None)
    cached_eval(ctx, cache, "test", spec)
    cached_eval(ctx, cache, "test", None, n=2, temperature=1.0)
    cached_eval(ctx, cache, "test", None, current=True, what="es-centre@1")
    assert len(calls) == 4
    ctx.close()

    ctx, cache, calls = run("b")
    again = cached_eval(ctx, cache, "test", None)
    cached_eval(ctx, cache, "test", spec)
    assert calls == [], "base and specialist greedy rows come from the shared file"
    assert again["correct"] == base_row["correct"] and again["shared_from"] == str(shared)
    assert again["key"] in EvalCache(ctx.run_dir / "evals.jsonl"), "copied into the run directory"
    cached_eval(ctx, cache, "test", None, n=2, temperature=1.0)
    cached_eval(ctx, cache, "test", None, current=True, what="es-centre@1")
    assert len(calls) == 2, "a sampled row and a checkpoint label are this run's own"
    ctx.close()

    ctx, cache, calls = run("c", exclude="embed")
    cached_eval(ctx, cache, "test", spec)
    assert len(calls) == 1, "the same seed perturbing other parameters is other weights"


def test_the_shared_eval_cache_never_asks_the_backend_for_a_perturber(tmp_path):
    """Under `--backend auto` on vLLM, reading `backend.perturber` switches the run to hf; a run with
    `--eval-cache` must stay on its engine, so the cache's salt takes the scheme from the config."""
    from types import SimpleNamespace

    from corp.runtime.context import run_evals, shared_salt

    class NoPerturber:
        @property
        def perturber(self):
            raise AssertionError("backend.perturber was read")

    cfg = SimpleNamespace(eval_cache=str(tmp_path / "shared.jsonl"), include=".*", exclude="", dtype=None, device="cpu")
    ctx = SimpleNamespace(cfg=cfg, backend=NoPerturber(), noise_scheme="corp-lowrank-v1:r=4", run_dir=tmp_path)
    assert '"scheme": "corp-lowrank-v1:r=4"' in shared_salt(ctx)
    run_evals(ctx)


def test_a_prompt_longer_than_the_context_is_one_line_naming_its_example_before_any_generation(tmp_path, monkeypatch):
    """Issue 57: a 1 MB prompt asked torch for 1 TB; an 80,000-character one ran 10+ minutes. The tiny
    model has 256 positions: a prompt of 300 tokens in the test split is refused before the support
    split (evaluated first) generates anything, naming the row and the lengths."""
    rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(6)]
    rows[4]["prompt"] = "1" * 300  # line 5
    # a relative path: the splits are drawn from a seed that includes the task's name, and pytest's
    # numbered tmp_path put line 5 in the support split in some sessions (the test then failed)
    monkeypatch.chdir(tmp_path)
    data = "d.jsonl"
    (tmp_path / data).write_text("".join(json.dumps(r) + "\n" for r in rows))
    backend = fresh_backend()
    generated = []
    real = backend.generate_rows
    backend.generate_rows = lambda *a, **k: generated.append(1) or real(*a, **k)
    cfg = tiny_cfg(tmp_path / "run", task=f"jsonl:{data}", n_support=1, n_test=5, population=1, top_k="1")
    with pytest.raises(CorpError, match=r"example 'line-5' \(test split\) is 30[0-9] tokens long.*context of 256") as e:
        with open_run(cfg, "randopt", backend) as ctx:
            ensure_population(ctx)
    assert not generated and "\n" not in str(e.value)
    assert "--max-completion-length" in str(e.value)  # the option that exists (there is no --max-new-tokens)
    # a call made past the run layer (a trainer's own batch) is refused by the backend itself
    with pytest.raises(CorpError, match="is 30[0-9] tokens long.*needs 3[0-9][0-9] positions"):
        fresh_backend().generate(["1" * 300], 8)
    assert fresh_backend().generate(["1" * 200], 8).texts  # 200 + 8 <= 256: fits


def test_a_non_empty_directory_corp_did_not_make_is_refused_before_any_work(tmp_path):
    """Issue 57: `--output-dir` on the user's own directory overwrote their config.yaml and appended to
    (and resumed from) their population.jsonl. Now one line, nothing read or written there."""
    mine = tmp_path / "userdir"
    mine.mkdir()
    (mine / "config.yaml").write_text("my: settings\n")
    (mine / "population.jsonl").write_text('{"key": "mine", "reward": 9}\n')
    snapshot = {p.name: p.read_bytes() for p in mine.iterdir()}
    backend, calls = counting(fresh_backend())
    for method in ("score", "consolidate"):
        with pytest.raises(CorpError, match=r"userdir' is a non-empty directory corp did not make.*new or empty"):
            setup_run(tiny_cfg(mine), method, backend)
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == snapshot and calls == []
    # an empty directory, and a run directory corp made, are still taken (a resume); so is a new one
    # holding only the write probe of another corp process opening it at the same moment
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".write-test.abc123").write_text("theirs")
    setup_run(tiny_cfg(tmp_path / "empty"), "score", backend).close()
    setup_run(tiny_cfg(tmp_path / "empty"), "score", backend).close()
    setup_run(tiny_cfg(tmp_path / "empty"), "score", backend).close()


def test_a_user_file_under_run_dir_model_is_refused_before_scoring(tmp_path):
    """Issue 57: a file of the user's in RUN_DIR/model was refused only when the model was saved, after
    all the scoring; a method that saves the model now checks the place before any work."""
    from corp.methods import get_method
    from tests.conftest import tiny_consolidate_config

    run = tmp_path / "run"
    setup_run(tiny_cfg(run), "score", fresh_backend()).close()  # a run directory corp made
    (run / "model").mkdir()
    (run / "model" / "notes.md").write_text("mine")
    backend, calls = counting(fresh_backend())
    with pytest.raises(CorpError, match=r"model/notes\.md"):
        get_method("consolidate")(tiny_consolidate_config("unused", run), backend)
    assert calls == [] and (run / "model" / "notes.md").read_text() == "mine"
