import json

import pytest

from corp.errors import CorpError
from corp.evaluate.rewards import compute_rewards, resolve_reward
from corp.evaluate.tasks import SPLITS, TASKS, Example, SplitSizes, get_task, make_splits
from corp.evaluate.tasks.countdown import verify
from corp.evaluate.tasks.gsm8k import extract_flexible, extract_strict, gold_answer
from corp.evaluate.tasks.math500 import equivalent, last_boxed


@pytest.mark.parametrize("spec", ["arith", "arith:digits=3,ops=+-*", "countdown", "gsm8k", "math500"])
def test_splits_disjoint_fixed_and_sized(spec, data_dir):
    task = get_task(spec, str(data_dir))
    sizes = SplitSizes(support=20, probe=10, validation=15, test=25)
    a = make_splits(task, sizes, seed=3)
    b = make_splits(task, sizes, seed=3)
    c = make_splits(task, sizes, seed=4)
    ids = {s: [e.id for e in a[s]] for s in SPLITS}
    prompts = [e.prompt for s in SPLITS for e in a[s]]
    assert [len(ids[s]) for s in SPLITS] == [20, 10, 15, 25]
    assert len({i for s in SPLITS for i in ids[s]}) == 70, "splits overlap"
    assert len(set(prompts)) == 70, "the same question appears in two splits"
    assert ids == {s: [e.id for e in b[s]] for s in SPLITS}, "split seed does not fix the splits"
    assert ids != {s: [e.id for e in c[s]] for s in SPLITS}


def test_gsm8k_test_split_comes_from_official_test_file(data_dir):
    sp = make_splits(get_task("gsm8k", str(data_dir)), SplitSizes(10, 10, 10, 10), 0)
    assert all(e.id.startswith("gsm8k-test-") for e in sp["test"])
    assert all(e.id.startswith("gsm8k-train-") for s in ("support", "probe", "validation") for e in sp[s])


def test_gsm8k_extractors_on_real_solutions(data_dir):
    rows = [json.loads(line) for line in open(data_dir / "gsm8k" / "test.jsonl")]
    assert all(extract_strict(r["answer"]) == gold_answer(r["answer"]) for r in rows)
    task = get_task("gsm8k", str(data_dir))
    ex = Example("x", "q", "1234")
    assert task.check(extract_flexible("so the total is $1,234."), ex)
    assert extract_strict("the answer is 1234") is None
    assert get_task("gsm8k:mode=strict", str(data_dir)).extract("#### 1,234") == "1234"


def test_math500_boxed_extraction_and_equivalence_on_real_solutions(data_dir):
    rows = [json.loads(line) for line in open(data_dir / "math500" / "test.jsonl")]
    assert all(equivalent(last_boxed(r["solution"]), r["answer"]) for r in rows)
    assert last_boxed(r"so \boxed{\frac{1}{2}} and then \boxed{x^{2}}") == "x^{2}"
    assert equivalent(r"\frac{1}{2}", "0.5") and not equivalent("3", "4")


def test_countdown_verifier():
    assert verify("(3 + 5) * 2", [2, 3, 5], 16)
    assert not verify("3 + 5 + 2", [2, 3, 5], 16), "wrong value"
    assert not verify("(3 + 5) * 2 * 1", [2, 3, 5], 16), "extra number"
    assert not verify("(3 + 3) * 2", [2, 3, 5], 12), "number reused"
    assert not verify("__import__('os')", [1], 1)
    task = get_task("countdown")
    ex = make_splits(task, SplitSizes(1, 0, 0, 0), 0)["support"][0]
    assert task.check(task.extract(f"Let me think.\nAnswer: {ex.answer}"), ex), "gold expression must verify"


def test_arith_reward_and_extraction():
    task = get_task("arith")
    ex = Example("a", "What is 2 + 3?", "5")
    assert task.reward(["2 + 3 = 5", "It is 6", ""], [ex] * 3) == [1.0, 0.0, 0.0]


def test_arith_extract_equation_reads_a_base_models_continuation():
    """Gemma 3 270M (a base model, no chat template) continues "What is 79 + 12? ..." with
    "\n\n79 + 12 = 91\n\n79 + 12 = 91" until its length runs out: the last number (the default) is then an
    operand, the number after the first "=" (extract=equation) is its answer."""
    cut = "\n\n79 + 12 = 91\n\n79 + 12"
    ex = Example("a", "What is 79 + 12? Answer with just the number.", "91")
    plain, equation = get_task("arith"), get_task("arith:extract=equation")
    assert plain.reward([cut], [ex]) == [0.0] and equation.reward([cut], [ex]) == [1.0]
    assert equation.extract("91") == "91" and equation.extract("\n\n79 + 12 =") is None
    assert equation.extract("x = -1,035 then") == "-1035"
    assert equation.signature()["extract"] == "equation" and "extract" not in plain.signature()
    with pytest.raises(CorpError, match="extract=first is unknown"):
        get_task("arith:extract=first")


def test_jsonl_task_and_malformed_line(tmp_path):
    good = tmp_path / "t.jsonl"
    good.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4", "hint": "x"}\n')
    task = get_task(f"jsonl:{good}")
    assert len(task.pools()["train"]) == 2 and task.extract("it is 4") == "4"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{not json\n')
    with pytest.raises(CorpError, match=r"bad\.jsonl' line 2"):
        get_task(f"jsonl:{bad}").pools()


def test_jsonl_repeated_prompts_are_dropped_so_no_prompt_is_in_two_splits(tmp_path):
    """Issue 57: duplicate rows were kept and one prompt landed in support and test."""
    rows = [{"prompt": f"q{i % 4}", "answer": str(i)} for i in range(8)]  # each prompt twice
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "q0", "answer": "0"}) + "\n")
    with pytest.warns(UserWarning, match="4 row.*repeat the prompt.*dropped.*line-5"):
        splits = make_splits(get_task(f"jsonl:{tmp_path / 'd.jsonl'}"), SplitSizes(2, 0, 0, 2), 0)
    prompts = [e.prompt for s in SPLITS for e in splits[s]]
    assert sorted(prompts) == ["q0", "q1", "q2", "q3"]
    with pytest.warns(UserWarning, match="5 row"):  # a train row that repeats a test prompt goes too
        pools = get_task(f"jsonl:{tmp_path / 'd.jsonl'}:test={tmp_path / 't.jsonl'}").pools()
    assert [e.prompt for e in pools["test"]] == ["q0"] and "q0" not in [e.prompt for e in pools["train"]]


def test_unknown_task_and_missing_data(tmp_path, monkeypatch):
    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    with pytest.raises(CorpError, match="unknown task 'nope'"):
        get_task("nope")
    with pytest.raises(CorpError, match="gsm8k"):
        get_task("gsm8k", str(tmp_path)).pools()
    with pytest.raises(CorpError, match="too large|fewer than"):
        make_splits(get_task("arith:pool=10"), SplitSizes(8, 8, 0, 0), 0)


def test_splits_drawn_after_every_needed_one_are_not_demanded(tmp_path):
    """RandOpt reads support and test: a dataset too small for the probe and validation defaults still
    runs, and its support and test are the examples every other method's run draws."""
    task = get_task("arith:pool=20")
    sizes = SplitSizes(8, 32, 64, 4)
    with pytest.raises(CorpError, match="test 4 \\+ support 8 \\+ probe 32 \\+ validation 64"):
        make_splits(task, sizes, 0)
    got = make_splits(task, sizes, 0, needs=("support", "test"))
    assert [len(got[s]) for s in SPLITS] == [8, 0, 0, 4]
    full = make_splits(task, SplitSizes(8, 2, 2, 4), 0)
    assert got["support"] == full["support"] and got["test"] == full["test"]
    only_support = make_splits(task, SplitSizes(8, 32, 64, 4), 0, needs=("support",))
    assert only_support["support"] == full["support"]  # test is drawn before support: still drawn


def test_the_size_error_names_a_data_file_not_its_task_spec(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}", "answer": "1"}) + "\n" for i in range(5)))
    with pytest.raises(CorpError, match=f"^'{tmp_path / 'd.jsonl'}' has 5 examples for selection, fewer than"):
        make_splits(get_task(f"jsonl:{tmp_path / 'd.jsonl'}"), SplitSizes(4, 0, 0, 4), 0)


def failing_reward(completions, answer, **_):
    out = []
    for _c, a in zip(completions, answer):
        if a == "boom":
            raise ValueError("boom")
        out.append(float("nan") if a == "nan" else 1.0)
    return out


def test_reward_that_raises_or_returns_nan_scores_zero_and_is_counted():
    task = get_task("arith")
    exs = [Example("1", "p", "1"), Example("2", "p", "boom"), Example("3", "p", "nan")]
    fn = resolve_reward("tests.test_tasks:failing_reward")
    with pytest.warns(UserWarning, match="failed on 2 of 3 example"):
        rewards, errors = compute_rewards(task, ["a", "b", "c"], exs, fn)
    assert rewards == [1.0, 0.0, 0.0] and errors == 2
    with pytest.raises(CorpError, match="--reward"):
        resolve_reward("no_such_module_xyz:fn")


def _registered_spec(name: str, tmp_path, request) -> tuple[str, str | None]:
    """A spec and data directory that build the registered task `name` offline."""
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]
    if name == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return f"jsonl:{path}", None
    if name == "csv":
        path = tmp_path / "t.csv"
        path.write_text("id,prompt,answer\n" + "".join(f"{r['id']},{r['prompt']},{r['answer']}\n" for r in rows))
        return f"csv:{path}", None
    if name == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        path = tmp_path / "t.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        return f"parquet:{path}", None
    if name == "rg":
        pytest.importorskip("reasoning_gym")
        return "rg:chain_sum:max_terms=2,max_digits=1,size=40", None
    if name == "reorder":
        pytest.importorskip("reasoning_gym")  # its default text ships with reasoning-gym
    if name in ("gsm8k", "math500", "mbpp", "humaneval"):
        return name, str(request.getfixturevalue("data_dir"))
    return name, None


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_registered_task_builds_splits_and_extracts(name, tmp_path, request):
    """Every entry of the task registry (a new one is covered without editing this test): it builds
    from its spec, its pools give examples with ids unique across pools, splits are disjoint, its signature is
    JSON, and extraction of a completion with no answer in it neither raises nor counts as right."""
    spec, data = _registered_spec(name, tmp_path, request)
    task = get_task(spec, data)
    examples = [e for pool in task.pools().values() for e in pool]
    assert examples and len({e.id for e in examples}) == len(examples)
    sizes = (
        SplitSizes(support=2, probe=1, validation=1, test=2) if task.pools().get("train") else SplitSizes(0, 0, 0, 2)
    )  # test-only (humaneval)
    splits = make_splits(task, sizes, seed=0)
    ids = [e.id for s in SPLITS for e in splits[s]]
    assert len(ids) == sum(vars(sizes).values()) and len(set(ids)) == len(ids)
    json.dumps(task.signature())
    ex = splits["test"][0]
    assert not task.check(None, ex)
    task.extract("I do not know.")


def test_task_registry_names_the_known_tasks_in_one_line():
    with pytest.raises(CorpError) as info:
        get_task("nope:digits=2")
    assert (
        str(info.value).startswith("unknown task 'nope'; known: arith, ")
        and "jsonl" in str(info.value)
        and "\n" not in str(info.value)
    )
