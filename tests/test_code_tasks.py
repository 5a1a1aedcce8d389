"""MBPP and HumanEval tasks: pools and splits, prompts, extraction, sandboxed rewards, pass@k.

The canonical-solution tests run every MBPP problem (974, few-shot ids included) and every
HumanEval problem (164) through the sandbox at concurrency 2; all must pass.
"""

from __future__ import annotations

import os

import pytest

from corp import CorpError
from corp.evaluate.tasks.base import SplitSizes, make_splits
from corp.evaluate.tasks.code import MBPP, HumanEval, extract_code, mbpp_entry_point
from corp.evaluate.voting import pass_at_k

if not os.environ.get("CORP_DATA_DIR") and os.path.isdir("/work/shared/data"):
    os.environ["CORP_DATA_DIR"] = "/work/shared/data"
needs_data = pytest.mark.skipif(not os.environ.get("CORP_DATA_DIR"), reason="needs CORP_DATA_DIR with mbpp/ and humaneval/")

# MBPP canonical solutions that genuinely fail their own tests upstream: none in this file
# (all 974 pass), so the list is empty; add ids here with a reason rather than loosening the test.
MBPP_KNOWN_BAD: set[int] = set()


def fence(code: str, lang: str = "python") -> str:
    return f"Here is the solution.\n```{lang}\n{code}\n```\nThis works because ..."


# ---------------------------------------------------------------- extraction


def test_extract_code_forms():
    assert extract_code("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1"
    two = "```python\ndef f():\n    return 1\n```\ntext\n```python\ndef f():\n    return 2\n```\n```\nf()\n```"
    assert extract_code(two) == "def f():\n    return 2"  # last python block wins over a later bare one
    assert extract_code("```\nx = 1\n```") == "x = 1"  # any fence
    assert extract_code("sure:\n```py\ndef g(): pass\n```") == "def g(): pass"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off inside the block
    assert extract_code("def f():\n    return 3\n") == "def f():\n    return 3"  # raw completion
    assert extract_code("") is None and extract_code("```python\n\n```") is None
    assert mbpp_entry_point("def helper(x):\n  pass\ndef main_fn(a):\n  pass", ["assert main_fn(helper(1)) == 2"]) == "main_fn"


# ---------------------------------------------------------------- pools, splits, prompts


@needs_data
def test_mbpp_pools_follow_the_official_split():
    pools = MBPP().pools()
    train_ids = sorted(e.columns["task_id"] for e in pools["train"])
    test_ids = sorted(e.columns["task_id"] for e in pools["test"])
    assert test_ids == list(range(11, 511))
    assert train_ids == list(range(511, 975))  # validation 511-600 + train 601-974; few-shot 1-10 excluded
    splits = make_splits(MBPP(), SplitSizes(support=100, probe=50, validation=90, test=200), seed=0)
    ids = {s: {e.id for e in exs} for s, exs in splits.items()}
    assert all(len(v) == n for v, n in zip(ids.values(), (100, 50, 90, 200)))
    assert not (ids["test"] & (ids["support"] | ids["probe"] | ids["validation"]))
    assert all(510 < int(i.split("-")[1]) for s in ("support", "probe", "validation") for i in ids[s])
    ex = next(e for e in pools["test"] if e.columns["task_id"] == 11)
    assert f"`{ex.columns['entry_point']}`" in ex.prompt and ex.columns["test_list"][0] in ex.prompt
    assert ex.columns["test_list"][1] not in ex.prompt  # only the first assert is shown


@needs_data
def test_humaneval_pools_are_test_only():
    task = HumanEval()
    pools = task.pools()
    assert pools["train"] == [] and len(pools["test"]) == 164
    assert len({e.id for e in pools["test"]}) == 164
    ex = pools["test"][0]
    assert ex.columns["function_prompt"].strip() in ex.prompt and ex.columns["entry_point"] in ex.prompt
    splits = make_splits(task, SplitSizes(support=0, probe=0, validation=0, test=20), seed=1)
    assert len(splits["test"]) == 20
    with pytest.raises(CorpError):
        make_splits(task, SplitSizes(support=1, probe=0, validation=0, test=20), seed=1)


def test_bad_options_are_corp_errors(monkeypatch, tmp_path):
    with pytest.raises(CorpError, match="timeout"):
        MBPP(timeout=-1)
    with pytest.raises(CorpError, match="memory_mb"):
        HumanEval(memory_mb=3)
    with pytest.raises(CorpError, match="concurrency"):
        MBPP(concurrency=0)
    with pytest.raises(CorpError, match="completions for 0 examples"):
        MBPP().reward(["x"], [])
    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    with pytest.raises(CorpError, match="needs data file"):
        HumanEval(data_dir=str(tmp_path)).pools()


# ---------------------------------------------------------------- canonical solutions (the sandbox must not break real code)


@needs_data
def test_all_canonical_mbpp_solutions_pass():
    task = MBPP(concurrency=2, timeout=10)
    examples = [task.make_example(row) for row in task._rows()]
    assert len(examples) == 974
    rewards = task.reward([fence(e.answer) for e in examples], examples)
    failed = [e.columns["task_id"] for e, r in zip(examples, rewards) if r != 1.0]
    assert sorted(failed) == sorted(MBPP_KNOWN_BAD), failed
    assert task.last_status_counts() == {"pass": 974 - len(MBPP_KNOWN_BAD), "fail": len(MBPP_KNOWN_BAD), "timeout": 0, "crash": 0, "sandbox_error": 0}


@needs_data
def test_all_canonical_humaneval_solutions_pass_full_and_body_only():
    task = HumanEval(concurrency=2, timeout=10)
    examples = task.pools()["test"]
    full = task.reward([fence(e.answer) for e in examples], examples)  # a full function in a fence
    assert full == [1.0] * 164, [e.id for e, r in zip(examples, full) if r != 1.0]
    body = [e.answer[len(e.columns["function_prompt"]) :] for e in examples]  # a base model continuing the body
    assert task.reward(body, examples) == [1.0] * 164
    assert task.last_status_counts()["pass"] == 164


# ---------------------------------------------------------------- wrong answers, adversarial completions, pass@k


@needs_data
def test_wrong_solutions_fail_and_counts_are_reported():
    task = MBPP(concurrency=2, timeout=2)
    ex = {e.columns["task_id"]: e for e in task.pools()["test"]}[11]
    name = ex.columns["entry_point"]
    completions = [
        fence(ex.answer),  # right
        fence(f"def {name}(*args):\n    return None"),  # wrong
        fence(f"def {name}(*args):\n    while True:\n        pass"),  # hangs
        fence(f"import sys\ndef {name}(*args):\n    return None\nsys.exit(0)"),  # exits before the asserts
        fence(f"import ctypes\ndef {name}(*args):\n    return ctypes.string_at(0)"),  # segfaults
        "I do not know.",  # prose, run as code: a syntax error
        "",  # nothing
    ]
    rewards = task.reward(completions, [ex] * len(completions))
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert task.last_status_counts() == {"pass": 1, "fail": 4, "timeout": 1, "crash": 1, "sandbox_error": 0}
    assert task.check(task.extract(completions[0]), ex) and not task.check(task.extract(completions[1]), ex)
    assert not task.check(None, ex)


@needs_data
def test_humaneval_wrong_solution_fails():
    task = HumanEval(timeout=5)
    ex = task.pools()["test"][0]
    wrong = fence(f"def {ex.columns['entry_point']}(numbers, threshold):\n    return False")
    assert task.reward([wrong], [ex]) == [0.0]
    assert task.last_status_counts()["fail"] == 1


@needs_data
def test_pass_at_k_on_code_rewards():
    task = MBPP(concurrency=2)
    by_id = {e.columns["task_id"]: e for e in task.pools()["test"]}
    a, b = by_id[11], by_id[12]
    wrong = lambda e: fence(f"def {e.columns['entry_point']}(*args):\n    return 0")  # noqa: E731
    samples = {a.id: [fence(a.answer), wrong(a), wrong(a), fence(a.answer)], b.id: [wrong(b)] * 4}
    flat = [(e, c) for e in (a, b) for c in samples[e.id]]
    rewards = task.reward([c for _, c in flat], [e for e, _ in flat])
    c_a, c_b = int(sum(rewards[:4])), int(sum(rewards[4:]))
    assert (c_a, c_b) == (2, 0)
    assert pass_at_k(4, c_a, 1) == pytest.approx(0.5) and pass_at_k(4, c_a, 2) == pytest.approx(5 / 6)
    assert pass_at_k(4, c_b, 4) == 0.0
