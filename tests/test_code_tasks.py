"""MBPP and HumanEval tasks: pools and splits, prompts, extraction, sandboxed rewards, pass@k.

The canonical-solution tests run every MBPP problem (974, few-shot ids included) and every
HumanEval problem (164) through the sandbox at concurrency 2; all must pass. Tests that need the
benchmark files take conftest's `data_dir` fixture (skipped, with the reason, where they are
absent); the reward tests on hand-made examples need no data.
"""

from __future__ import annotations

import pytest

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, SplitSizes, make_splits
from corp.evaluate.tasks.coding import MBPP, HumanEval, extract_code, mbpp_entry_point
from corp.evaluate.voting import pass_at_k

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
    assert (
        mbpp_entry_point("def helper(x):\n  pass\ndef main_fn(a):\n  pass", ["assert main_fn(helper(1)) == 2"])
        == "main_fn"
    )


# ---------------------------------------------------------------- pools, splits, prompts


def test_mbpp_pools_follow_the_official_split(data_dir):
    pools = MBPP(data_dir=str(data_dir)).pools()
    train_ids = sorted(e.columns["task_id"] for e in pools["train"])
    test_ids = sorted(e.columns["task_id"] for e in pools["test"])
    assert test_ids == list(range(11, 511))
    assert train_ids == list(range(511, 975))  # validation 511-600 + train 601-974; few-shot 1-10 excluded
    splits = make_splits(
        MBPP(data_dir=str(data_dir)), SplitSizes(support=100, probe=50, validation=90, test=200), seed=0
    )
    ids = {s: {e.id for e in exs} for s, exs in splits.items()}
    assert all(len(v) == n for v, n in zip(ids.values(), (100, 50, 90, 200)))
    assert not (ids["test"] & (ids["support"] | ids["probe"] | ids["validation"]))
    assert all(510 < int(i.split("-")[1]) for s in ("support", "probe", "validation") for i in ids[s])
    ex = next(e for e in pools["test"] if e.columns["task_id"] == 11)
    assert f"`{ex.columns['entry_point']}`" in ex.prompt and ex.columns["test_list"][0] in ex.prompt
    assert ex.columns["test_list"][1] not in ex.prompt  # only the first assert is shown


def test_humaneval_pools_are_test_only(data_dir):
    task = HumanEval(data_dir=str(data_dir))
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
    with pytest.raises(CorpError, match="unsafe_no_isolation"):
        MBPP(unsafe_no_isolation=2)
    with pytest.raises(CorpError, match="completions for 0 examples"):
        MBPP().reward(["x"], [])
    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    with pytest.raises(CorpError, match="needs data file"):
        HumanEval(data_dir=str(tmp_path)).pools()


# ---------------------------------------------------------------- canonical solutions
# (the sandbox must not break real code)


@pytest.mark.slow
def test_all_canonical_mbpp_solutions_pass(data_dir):
    # 20 s: problem 123's solution needs ~3 s of CPU, and a loaded 2-CPU machine stretched that past 10 s of wall time
    task = MBPP(data_dir=str(data_dir), concurrency=2, timeout=20)
    examples = [task.make_example(row) for row in task._rows()]
    assert len(examples) == 974
    rewards = task.reward([fence(e.answer) for e in examples], examples)
    failed = [e.columns["task_id"] for e, r in zip(examples, rewards) if r != 1.0]
    assert sorted(failed) == sorted(MBPP_KNOWN_BAD), failed
    counts = task.last_status_counts()
    expected = {
        "pass": 974 - len(MBPP_KNOWN_BAD),
        "fail": len(MBPP_KNOWN_BAD),
        "timeout": 0,
        "crash": 0,
        "sandbox_error": 0,
    }
    assert {k: counts[k] for k in expected} == expected


@pytest.mark.slow
def test_all_canonical_humaneval_solutions_pass_full_and_body_only(data_dir):
    task = HumanEval(data_dir=str(data_dir), concurrency=2, timeout=10)
    examples = task.pools()["test"]
    full = task.reward([fence(e.answer) for e in examples], examples)  # a full function in a fence
    assert full == [1.0] * 164, [e.id for e, r in zip(examples, full) if r != 1.0]
    body = [e.answer[len(e.columns["function_prompt"]) :] for e in examples]  # a base model continuing the body
    assert task.reward(body, examples) == [1.0] * 164
    assert task.last_status_counts()["pass"] == 164


# ---------------------------------------------------------------- wrong answers, adversarial completions, pass@k


def test_wrong_solutions_fail_and_counts_are_reported(data_dir):
    task = MBPP(data_dir=str(data_dir), concurrency=2, timeout=2)
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
    counts = task.last_status_counts()
    level = task.isolation()["level"]
    assert counts == {
        "pass": 1,
        "fail": 4,
        "timeout": 1,
        "crash": 1,
        "sandbox_error": 0,
        f"isolation:{level}": 6,
    }  # 6 with code
    assert task.check(task.extract(completions[0]), ex) and not task.check(task.extract(completions[1]), ex)
    assert not task.check(None, ex)


def test_humaneval_wrong_solution_fails(data_dir):
    task = HumanEval(data_dir=str(data_dir), timeout=5)
    ex = task.pools()["test"][0]
    wrong = fence(f"def {ex.columns['entry_point']}(numbers, threshold):\n    return False")
    assert task.reward([wrong], [ex]) == [0.0]
    assert task.last_status_counts()["fail"] == 1


def test_pass_at_k_on_code_rewards(data_dir):
    task = MBPP(data_dir=str(data_dir), concurrency=2)
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


# ---------------------------------------------------------------- rewards that could be faked (no data needed)

ADD = Example(
    "mbpp-x",
    "Write add.",
    "def add(a, b):\n    return a + b",
    columns={
        "task_id": 0,
        "entry_point": "add",
        "test_setup_code": "",
        "test_list": ["assert add(2, 2) == 4", "assert add(-1, 1) == 0"],
    },
)


def test_cheating_completions_score_zero_and_the_isolation_level_is_printed(capsys):
    task = MBPP(timeout=5, concurrency=2)
    cheats = [
        # an object equal to everything
        "class A:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return A()",
        # a subclass of int equal to everything (travels as its int value)
        "class A(int):\n    def __eq__(self, other):\n        return "
        "True\n    __hash__ = int.__hash__\ndef add(a, b):\n    return A(7)",
        # patches the builtins the asserts would use, then exits before them
        "import builtins, sys\nbuiltins.AssertionError = type('X', "
        "(Exception,), {})\ndef add(a, b):\n    return 0\nsys.exit(0)",
        # answers read from the asserts: there are none to read in the program's process
        "import gc, re\nsrc = ' '.join(s for o in gc.get_objects() if "
        "isinstance(o, dict) for s in o.values() if isinstance(s, str))\n"
        "ANS = {int(a): int(b) for a, b in re.findall(r'add\\((-?\\d+), "
        "-?\\d+\\) == (-?\\d+)', src)}\ndef add(a, b):\n    return ANS.get(a)",
    ]
    rewards = task.reward([fence(c) for c in cheats] + [fence(ADD.answer)], [ADD] * (len(cheats) + 1))
    assert rewards == [0.0] * len(cheats) + [1.0]
    level = task.isolation()["level"]
    assert f"isolation level '{level}'" in capsys.readouterr().err
    assert task.last_status_counts()[f"isolation:{level}"] == len(cheats) + 1


def test_the_program_cannot_read_the_humaneval_file(data_dir):
    task = HumanEval(data_dir=str(data_dir), timeout=5)
    ex = task.pools()["test"][0]
    path = data_dir / "humaneval" / "HumanEval.jsonl"
    # copies the canonical solution out of the data file when it can see it
    thief = fence(
        "import json\n"
        f"row = [json.loads(l) for l in open({str(path)!r})][0]\n"
        "exec(row['prompt'] + row['canonical_solution'])\n"
    )
    assert task.reward([thief], [ex]) == [0.0]
    assert "FileNotFoundError" in task.last_results[0].stderr
