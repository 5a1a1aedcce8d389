"""Racing (`--race halving`, corp.evaluate.racing): the rung rules, the guarantee that every
specialist a method uses is scored on the whole support split (planted: a stopped specialist whose
partial mean beats the survivors), identical rows for those specialists with and without racing,
a ledger that counts what was generated, and clear refusals."""

from __future__ import annotations

import pytest

from corp.config import RandOptConfig, load_config
from corp.errors import CorpError
from corp.evaluate import racing
from corp.evaluate.scorer import ensure_population
from corp.runtime.context import setup_run
from tests.test_methods import text_checksum  # noqa: F401  (the reward below moves with the output text)
from tests.test_scorer import fresh_backend

REWARD = "tests.test_methods:text_checksum"


def test_rungs_and_survivors():
    assert racing.rungs(64, 8, 2) == [8, 16, 32, 64]
    assert racing.rungs(20, 8, 2) == [8, 16, 20]
    assert racing.rungs(5, 8, 2) == [5]
    assert racing.survivors({0: 0.9, 1: 0.1, 2: 0.5, 3: 0.5}, keep=1, eta=2) == [0, 2, 3], (
        "ties with the last kept are kept"
    )
    assert racing.survivors({0: 0.9, 1: 0.1, 2: 0.2, 3: 0.3}, keep=3, eta=2) == [0, 2, 3], "never fewer than keep"
    tied = {i: 0.125 for i in range(6)} | {6: 0.25, 7: 0.0}  # coarse rewards: most of the population tied
    assert racing.survivors(tied, keep=1, eta=2) == [0, 1, 2, 3, 4, 5, 6], "ties kept: 7 of 8 go on"
    assert racing.survivors(tied, keep=1, eta=2, ties="order") == [0, 1, 2, 6], "ties by population order: exactly half"


def test_a_stopped_specialist_that_would_be_used_is_completed_first():
    """Planted: B was stopped with a partial mean 1.0 on 2 examples, above A's full 0.5; RandOpt's
    top-1 must not be chosen on B's partial estimate: B is scored on the rest, then ranked again."""

    class Ctx:
        splits = {"support": [object()] * 8}

        def example_ids(self, split):
            return [f"e{i}" for i in range(8)]

        def eval_context(self):
            return {"model": "m"}

    full = {
        "kind": "specialist",
        "seed": 1,
        "sigma": 0.1,
        "index": 0,
        "reward": 0.5,
        "n_examples": 8,
        "rewards": [1, 0] * 4,
        "correct": [1, 0] * 4,
        "answers": ["x"] * 8,
    }
    raced = {
        "kind": racing.RACED,
        "seed": 2,
        "sigma": 0.1,
        "index": 1,
        "reward": 1.0,
        "n_examples": 2,
        "rewards": [1, 1],
        "correct": [1, 1],
        "answers": ["y"] * 2,
        "prompt_tokens": 4,
        "generated_tokens": 2,
        "split": "support",
    }
    calls = []

    def score(ctx, specs, split, cache, desc, indices):
        calls.append((specs, split, [id(e) for e in ctx.splits[split]] and len(ctx.splits[split])))
        return {
            specs[0]: {
                **raced,
                "split": split,
                "rewards": [0] * 6,
                "correct": [0] * 6,
                "answers": ["z"] * 6,
                "prompt_tokens": 12,
                "generated_tokens": 6,
            }
        }

    class Cache:
        def put(self, row):
            return row

    rows = racing.complete_needed(Ctx(), [raced, full], lambda rows: [0], Cache(), score)
    assert calls == [([(2, 0.1)], "support[2:8]", 6)], "B scored once, on the 6 examples it had not seen"
    assert [r["index"] for r in rows] == [0, 1], "re-ranked: A's full 0.5 now beats B's full 0.25"
    b = rows[1]
    assert (
        b["kind"] == "specialist" and b["n_examples"] == 8 and b["reward"] == 0.25 and b["rewards"] == [1, 1] + [0] * 6
    )
    assert b["prompt_tokens"] == 16 and b["generated_tokens"] == 8, "tokens: the 2 seen + the 6 completed, each once"


def cfg(tmp_path, name, **kw):
    base = dict(
        task="arith",
        reward=REWARD,
        population=8,
        sigmas="0.05,0.1",
        n_support=8,
        n_probe=0,
        n_validation=0,
        n_test=4,
        top_k="1,2",
        max_new_tokens=6,
        run_dir=str(tmp_path / name),
    )
    return load_config(RandOptConfig, None, {**base, **kw})


def test_race_scores_what_randopt_uses_in_full_with_the_rows_of_an_unraced_run(tmp_path):
    full_ctx = setup_run(cfg(tmp_path, "full"), "randopt", fresh_backend())
    full = ensure_population(full_ctx)
    full_ctx.close()
    by_index = {r["index"]: r for r in full}

    ctx = setup_run(cfg(tmp_path, "raced", race="halving", race_first=2, race_eta=2), "randopt", fresh_backend())
    ranked = ensure_population(ctx, keep=2, need=lambda rows: range(2))
    ctx.close()
    assert len(ranked) == 8 and sorted(r["index"] for r in ranked) == list(range(8))
    assert any(r["kind"] == racing.RACED for r in ranked), "the race stopped someone (else this test shows nothing)"
    for r in ranked[:2]:
        assert r["kind"] == "specialist" and r["n_examples"] == 8
        assert (r["rewards"], r["answers"]) == (by_index[r["index"]]["rewards"], by_index[r["index"]]["answers"]), (
            "same examples, same outputs as a full run"
        )
        assert r["key"] == by_index[r["index"]]["key"]
    for r in ranked:
        if r["kind"] == racing.RACED:
            assert r["n_examples"] < 8 and r["rewards"] == by_index[r["index"]]["rewards"][: r["n_examples"]]
    generated = sum(r["generated_tokens"] for r in ranked)
    assert generated < sum(r["generated_tokens"] for r in full), (
        "the ledger counts what was generated: less than a full population"
    )
    assert ctx.population_source["race"]["stopped"] == sum(
        r["kind"] == racing.RACED for r in ranked
    ) + ctx.population_source.get("completed_after_race", 0)


def test_the_replay_benchmark_races_as_a_real_run_does(tmp_path):
    """benchmarks/racing_replay.py answers a race from a full run's rows instead of generating; on
    the same population it must make the real race's decisions: the same rungs, the same
    specialists stopped, the same examples scored, the same top K."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "racing_replay", Path(__file__).resolve().parents[1] / "benchmarks" / "racing_replay.py"
    )
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    full_ctx = setup_run(cfg(tmp_path, "full"), "randopt", fresh_backend())
    ensure_population(full_ctx)
    full_ctx.close()
    ctx = setup_run(cfg(tmp_path, "raced", race="halving", race_first=2, race_eta=2), "randopt", fresh_backend())
    ranked = ensure_population(ctx, keep=2, need=lambda rows: range(2))
    ctx.close()
    got = replay.replay(tmp_path / "full", first=2, eta=2, ties="keep", top_k=2, quantiles=[0.5], who="randopt")
    assert (
        got["rungs"] == ctx.population_source["race"]["rungs"]
        and got["stopped"] == ctx.population_source["race"]["stopped"]
    )
    assert got["examples"] == sum(r["n_examples"] for r in ranked) < 8 * 8
    assert got["identical"] == ([r["index"] for r in ranked[:2]] == got["full_top"])


def test_randopt_and_score_with_racing_through_the_registry(tmp_path):
    from corp.methods.randopt import run_randopt
    from corp.methods.score import run_score

    report = run_randopt(cfg(tmp_path, "r", race="halving", race_first=2), backend=fresh_backend())
    assert report["population"]["source"]["race"]["rule"] == "successive halving"
    with pytest.raises(CorpError, match="--race-keep"):
        run_score(cfg(tmp_path, "s", race="halving"), backend=fresh_backend())


def test_analysis_refuses_a_raced_population(tmp_path):
    from corp.methods.analyze_rank.split_half import load_run_population
    from corp.methods.score import run_score

    run_score(cfg(tmp_path, "s", race="halving", race_first=2, race_keep=1), backend=fresh_backend())
    with pytest.raises(CorpError, match="raced population"):
        load_run_population(tmp_path / "s")


@pytest.mark.parametrize(
    "bad, msg",
    [
        ({"race": "bandit"}, "unknown --race"),
        ({"race": "halving", "race_eta": 1}, "race-eta"),
        ({"race": "halving", "from_run": "x"}, "drop one"),
        ({"race": "halving", "race_ties": "coin"}, "race-ties"),
    ],
)
def test_bad_race_options_are_one_line(tmp_path, bad, msg):
    with pytest.raises(CorpError, match=msg):
        cfg(tmp_path, "bad", **bad)
