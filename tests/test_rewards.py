"""Rewards: any finite float, a function that never works stops the run, both call forms, where
the function is found."""

import sys

import pytest

from corp.errors import CorpError
from corp.evaluate.rewards import compute_rewards, resolve_reward
from corp.evaluate.tasks import Example, get_task

EXS = [
    Example("1", "p1", "1", {"tag": "x"}),
    Example("2", "p2", "2", {"tag": "y"}),
    Example("3", "p3", "3", {"tag": "z"}),
]


def always_raises(completions, **_):
    raise RuntimeError("no reward today")


def wrong_signature(completions, answer, missing_column):
    return [1.0] * len(completions)


def always_nan(completions, **_):
    return [float("nan")] * len(completions)


def scaled(completions, answer, **_):
    return [{"1": 5.0, "2": -2.5, "3": float("inf")}[a] for a in answer]


def per_completion(completion, answer, tag=None, **_):
    return float(completion.strip() == answer) + (0.5 if tag == "y" else 0.0)


def trl_style(prompts, completions, answer, **_):
    assert prompts == ["p1", "p2", "p3"][: len(completions)] or len(completions) == 1
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def flaky(completions, answer, **_):
    if answer[0] == "boom":
        raise ValueError("boom")
    return [1.0] * len(completions)


@pytest.mark.parametrize(
    "fn, message",
    [
        (always_raises, "always_raises.*RuntimeError: no reward today"),
        (wrong_signature, "wrong_signature.*TypeError"),
        (always_nan, r"always_nan.*returned nan \(float\), not a finite number"),
    ],
)
def test_a_reward_that_fails_on_every_example_stops_with_one_line(fn, message):
    task = get_task("arith")
    with pytest.raises(CorpError, match=message):
        compute_rewards(task, ["a", "b", "c"], EXS, resolve_reward(fn))


def test_a_reward_that_worked_once_is_not_stopped_by_one_bad_evaluation():
    task = get_task("arith")
    fn = resolve_reward(flaky)
    assert compute_rewards(task, ["a"], [Example("1", "p", "ok")], fn) == ([1.0], 0)
    with pytest.warns(UserWarning, match="boom"):
        assert compute_rewards(task, ["a"], [Example("2", "p", "boom")], fn) == ([0.0], 1)


def test_any_finite_float_is_a_reward_and_non_finite_is_an_error():
    with pytest.warns(UserWarning, match="inf"):
        rewards, errors = compute_rewards(get_task("arith"), ["a", "b", "c"], EXS, resolve_reward(scaled))
    assert rewards == [5.0, -2.5, 0.0] and errors == 1


def test_per_completion_and_trl_batched_forms_are_detected_and_called_right():
    task = get_task("arith")
    pc = resolve_reward(per_completion)
    assert pc.per_completion
    assert compute_rewards(task, ["1", "x", "3"], EXS, pc) == ([1.0, 0.5, 1.0], 0)
    trl = resolve_reward(trl_style)
    assert not trl.per_completion
    assert compute_rewards(task, ["1", "x", "3"], EXS, trl) == ([1.0, 0.0, 1.0], 0)


def test_reward_module_in_working_directory_is_found_without_pythonpath(tmp_path, monkeypatch):
    (tmp_path / "my_local_reward.py").write_text(
        "def score(completion, answer, **_):\n    return 2.0 if completion == answer else -1.0\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_local_reward", raising=False)
    fn = resolve_reward("my_local_reward:score")
    assert compute_rewards(get_task("arith"), ["1", "x"], EXS[:2], fn) == ([2.0, -1.0], 0)
    fn2 = resolve_reward(f"{tmp_path / 'my_local_reward.py'}:score")
    assert fn2.per_completion
    with pytest.raises(CorpError, match="does not exist"):
        resolve_reward("nowhere/none.py:score")
    with pytest.raises(CorpError, match="has no function 'nope'"):
        resolve_reward("my_local_reward:nope")


def strict_per_completion(completion, answer):
    return float(completion == answer)


def strict_batched(completions, answer):
    return [float(c == a) for c, a in zip(completions, answer)]


def test_functions_without_kwargs_get_only_the_columns_they_name():
    for fn in (strict_per_completion, strict_batched):
        assert compute_rewards(get_task("arith"), ["1", "x", "3"], EXS, resolve_reward(fn)) == ([1.0, 0.0, 1.0], 0)


def _short_by_one(completions, **_):
    return [1.0] * (len(completions) - 1) if len(completions) > 1 else [1.0]


def _scalar(completions, **_):
    return 1.0


def _huge(completion, **_):
    return 1e308


def test_a_batched_reward_with_the_wrong_number_of_values_stops_the_run():
    """Not re-called one completion at a time (which answered 1.0 for all three, reward_errors 0)."""
    with pytest.raises(CorpError, match="returned 2 values for 3 completions"):
        compute_rewards(get_task("arith"), ["1", "x", "3"], EXS, resolve_reward(_short_by_one))
    with pytest.raises(CorpError, match=r"returned 1\.0 \(float\), not a list"):
        compute_rewards(get_task("arith"), ["1", "x", "3"], EXS, resolve_reward(_scalar))


def test_rewards_whose_mean_overflows_are_refused():
    with pytest.raises(CorpError, match="sum to more than float32 holds"):
        compute_rewards(get_task("arith"), ["1", "x", "3"], EXS, resolve_reward(_huge))


THRESHOLD = 1.0  # read by `_reads_a_global`: its value is part of the reward's identity


def _reads_a_global(completions, **_):
    return [_scale() for _ in completions]


def _scale():
    return THRESHOLD * LEVELS["high"]


LEVELS = {"high": 1.0}


def test_a_global_the_reward_reads_is_part_of_its_identity(monkeypatch):
    """Rows cached under THRESHOLD = 1 must not resume a run after THRESHOLD = 9 (issue 57: rewards
    [1, 1, 9, 9] in one run): plain globals the function reads, also through a helper, key it."""
    from corp.evaluate.rewards import register_reward

    first = register_reward([_reads_a_global])
    assert register_reward([_reads_a_global]) == first
    monkeypatch.setattr(sys.modules[__name__], "THRESHOLD", 9.0)
    assert register_reward([_reads_a_global]) != first
    changed = register_reward([_reads_a_global])
    monkeypatch.setitem(LEVELS, "high", 2.0)  # read by the helper it calls
    assert register_reward([_reads_a_global]) != changed


def _returns(value):
    def reward(completion, **_):
        return value

    return reward


@pytest.mark.parametrize(
    "value, named",
    [
        (float("nan"), r"nan \(float\)"),
        (float("inf"), r"inf \(float\)"),
        ("1.0", r"'1\.0' \(str\)"),
        ("2d", r"array\(\[\[1\., 2\.\]\]\) \(ndarray of shape \(1, 2\)\)"),
    ],
)
def test_a_reward_that_is_no_finite_number_is_named_as_returned(value, named):
    """From the Python API (a registered, combined reward) too: not 'returned None' (issue 57)."""
    import numpy as np

    from corp.evaluate.rewards import register_reward

    value = np.array([[1.0, 2.0]]) if value == "2d" else value
    for fn in (resolve_reward(_returns(value)), resolve_reward(register_reward([_returns(value)]))):
        with pytest.raises(CorpError, match=f"returned {named}.*not a finite number"):
            compute_rewards(get_task("arith"), ["1", "x", "3"], EXS, fn)
