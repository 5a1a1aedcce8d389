import pytest

from corp.config import RandOptConfig, load_config
from corp.errors import CorpError
from corp.evaluate.scorer import ensure_population
from corp.runtime.backends.hf import HFBackend
from corp.runtime.context import TIMING_FIELDS, setup_run
from corp.runtime.runs import read_jsonl
from tests.conftest import make_char_tokenizer, make_tiny_llama


def tiny_cfg(run_dir, **kw):
    base = dict(
        task="arith",
        population=4,
        sigmas="0.05,0.1",
        n_support=6,
        n_probe=0,
        n_validation=0,
        n_test=6,
        top_k="1,2",
        max_new_tokens=6,
        run_dir=str(run_dir),
    )
    base.update(kw)
    return load_config(RandOptConfig, None, base)


def fresh_backend():
    tok = make_char_tokenizer()
    return HFBackend(make_tiny_llama(tok), tok, batch_size=8)


def strip_timing(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def test_population_resumes_after_interrupt_with_identical_rows(tmp_path):
    full = ensure_population(setup_run(tiny_cfg(tmp_path / "full"), "randopt", fresh_backend()))

    backend = fresh_backend()
    real_generate, calls = backend.generate, {"n": 0}

    def dying_generate(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # a Ctrl-C while the third specialist is in flight
        return real_generate(*a, **k)

    backend.generate = dying_generate
    with pytest.raises(KeyboardInterrupt):
        ensure_population(setup_run(tiny_cfg(tmp_path / "cut"), "randopt", backend))
    saved = read_jsonl(tmp_path / "cut" / "population.jsonl", key="key")
    assert len(saved) == 2, "exactly the specialists finished before the interrupt are kept"
    with open(tmp_path / "cut" / "population.jsonl", "a") as fh:
        fh.write('{"key": "torn')  # and a torn line from a kill mid-write

    resumed_backend = fresh_backend()
    seen = []
    real = resumed_backend.set_direction
    resumed_backend.set_direction = lambda d: (seen.append(d), real(d))[1]
    resumed = ensure_population(setup_run(tiny_cfg(tmp_path / "cut"), "randopt", resumed_backend))
    scored_again = [d for d in seen if d is not None]
    assert len(scored_again) == 2, "only the two missing specialists are scored on resume"
    assert strip_timing(resumed) == strip_timing(full)


def test_population_from_other_task_is_refused(tmp_path):
    ensure_population(setup_run(tiny_cfg(tmp_path / "a"), "randopt", fresh_backend()))
    cfg = tiny_cfg(tmp_path / "b", task="arith:digits=3", population_from=str(tmp_path / "a"))
    with pytest.raises(CorpError, match="task"):
        ensure_population(setup_run(cfg, "randopt", fresh_backend()))


def test_randopt_report_on_tiny_model(tmp_path):
    from corp.evaluate.population import population_summary, randopt_results
    from corp.methods.randopt import comparisons_vs_base
    from corp.runtime.loop import Outputs, finish

    ctx = setup_run(tiny_cfg(tmp_path / "r"), "randopt", fresh_backend())
    ranked = ensure_population(ctx)
    assert [r["reward"] for r in ranked] == sorted((r["reward"] for r in ranked), reverse=True)
    results, test_rows = randopt_results(ctx, ranked, [1, 2])
    names = [r.method for r in results]
    assert names == ["base", "randopt-top1", "randopt-vote@2"]
    vote = results[2]
    assert vote.passes_per_example == 2
    assert vote.ledger.inference_tokens == sum(
        test_rows[(r["seed"], r["sigma"])]["prompt_tokens"] + test_rows[(r["seed"], r["sigma"])]["generated_tokens"]
        for r in ranked[:2]
    )
    fields = {"population": population_summary(ctx, ranked)}
    report = finish(ctx, Outputs(results, comparisons_vs_base(results), ctx.example_ids("test"), fields))
    assert report["population"]["n"] == 4 and "FLOPs" in report["flops_formula"]


def test_rows_count_the_completions_cut_at_the_length_limit_and_time_the_reward(tmp_path):
    """A completion that used every new token it was allowed is counted in `truncated` (the length a
    config needs is chosen from it); one that stopped earlier is not."""
    from types import SimpleNamespace

    from corp.runtime.backends.base import Generations
    from corp.runtime.context.evaluation import score_generations

    ctx = setup_run(tiny_cfg(tmp_path / "r", max_new_tokens=6), "randopt", fresh_backend())
    exs = ctx.splits["support"][:3]
    gens = Generations(texts=["12", "3 4 5 6", "7"], prompt_tokens=[5, 5, 5], generated_tokens=[2, 6, 6])
    res = score_generations(ctx, exs, gens)
    assert res.truncated == 2 and res.reward_seconds >= 0.0
    res = score_generations(SimpleNamespace(**{**ctx.__dict__, "max_new_tokens": 7}), exs, gens)
    assert res.truncated == 0
    row = ensure_population(ctx)[0]
    assert {"truncated", "reward_seconds"} <= set(row) and 0 <= row["truncated"] <= row["n_examples"]


def test_scoring_says_what_the_rest_will_take_after_the_first_specialist(tmp_path, monkeypatch, capsys):
    """A population (consolidate's, RandOpt's) is population size x seconds per specialist: after the
    first is scored, one line says how many are left and about how long they will take."""
    import re

    monkeypatch.delenv("CORP_NO_PROGRESS", raising=False)
    ensure_population(setup_run(tiny_cfg(tmp_path / "run"), "randopt", fresh_backend()))
    said = [line for line in capsys.readouterr().err.splitlines() if " to go, about " in line]
    assert len(said) == 1 and re.match(
        r"population: 3 specialists to go, about \d+ s \(.* s each, as the first took\)$", said[0]
    ), said


def test_randopt_says_its_test_passes_and_their_time_before_they_start(tmp_path, monkeypatch, capsys):
    """After the population, RandOpt's test rows (the base and the top K) are minutes of silence at the quick
    start's size: one line says how many passes, at the population's rate, before the first of them (issue 56);
    a rerun, whose rows are all cached, says none."""
    import re

    from corp.methods.randopt import run_randopt

    monkeypatch.delenv("CORP_NO_PROGRESS", raising=False)
    run_randopt(tiny_cfg(tmp_path / "run"), fresh_backend())
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("randopt: ")]
    assert len(said) == 1 and re.match(
        r"randopt: 3 passes to go, about \d+ s \(test rows 3; .* s per example, at the population's rate\)$", said[0]
    ), said  # the base and the top 2 on test
    assert err.index(said[0]) < err.index("test eval"), "said before the test rows start"
    run_randopt(tiny_cfg(tmp_path / "run"), fresh_backend())
    assert "randopt: " not in capsys.readouterr().err


def test_say_passes_times_each_stage_by_its_examples_and_marks_a_bound(monkeypatch, capsys):
    from corp.runtime.ledger import Passes, say_passes, seconds_per_example

    rate = seconds_per_example([{"seconds": 3.0, "apply_seconds": 0.5, "reward_seconds": 0.5, "n_examples": 4}] * 2)
    assert rate == 1.0
    monkeypatch.delenv("CORP_NO_PROGRESS", raising=False)
    stages = [Passes("step search", 9, 9 * 32), Passes("gates", 0, 0), Passes("stage 2", 10, 100, at_most=True)]
    say_passes("consolidate", stages, rate, "at the population's rate")
    assert capsys.readouterr().err.strip() == (
        "consolidate: up to 19 passes to go, about 6 min at most "
        "(step search 9, stage 2 up to 10; 1 s per example, at the population's rate)"
    )
    monkeypatch.setenv("CORP_NO_PROGRESS", "1")
    say_passes("consolidate", stages, rate, "at the population's rate")
    assert capsys.readouterr().err == ""
