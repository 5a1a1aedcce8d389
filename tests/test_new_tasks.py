"""reasoning-gym (`rg:NAME`) and story ordering (`reorder`): split reproducibility, rewards on
hand-made completions, the reorder reward's worked examples, `corp tasks`, and two-specialist
`corp score` runs through the CLI on the embedded model."""

import json
import os
import subprocess
import sys

import pytest

from corp.errors import CorpError
from corp.evaluate.tasks import SPLITS, SplitSizes, get_task, list_tasks, make_splits
from corp.evaluate.tasks.reorder import extract_order, order_reward, split_sentences
from corp.extras import available

# the three reasoning-gym tasks of the README's evidence (base accuracy of the embedded model 5-60%)
SMALL = "instruction=none,extract=fallback,max_new_tokens=24"
RG_TASKS = [
    f"rg:chain_sum:max_terms=2,max_digits=1,{SMALL}",
    f"rg:gcd:max_value=20,{SMALL}",
    f"rg:letter_counting:min_words=1,max_words=3,{SMALL}",
]

needs_gym = pytest.mark.skipif(
    not available("reasoning-gym"), reason="reasoning-gym not installed (pip install 'corp[reasoning-gym]')"
)


def _ids(task, seed=0, sizes=SplitSizes(8, 4, 4, 8)):  # noqa: B008  (read, never mutated)
    sp = make_splits(task, sizes, seed)
    return {s: [(e.id, e.prompt, e.answer) for e in sp[s]] for s in SPLITS}


# ---------------------------------------------------------------- story ordering


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("ABCDE", 1.0),  # all right
        ("EDCBA", 0.6 * 1 / 5),  # reversed: only the middle position, no pair in order
        ("ABDCE", 0.6 * 3 / 5 + 0.4 * 3 / 4),  # one adjacent swap
        ("BCDEA", 0.6 * 0 + 0.4 * 3 / 4),  # first sentence moved to the end
        (None, 0.0),
    ],
)
def test_reorder_reward_worked_examples(answer, expected):
    assert order_reward(answer, "ABCDE") == pytest.approx(expected)
    # the same answers, relabelled: the reward depends on the order, not on the letters
    relabel = str.maketrans("ABCDE", "CEADB")
    assert order_reward(answer.translate(relabel) if answer else None, "ABCDE".translate(relabel)) == pytest.approx(
        expected
    )


@needs_gym  # the default text ships with reasoning-gym
def test_reorder_extraction_and_reward_on_completions():
    assert extract_order("The original order is: C, A, E, B, D.") == "CAEBD"
    assert extract_order("C -> A -> E -> B -> D") == "CAEBD"
    assert extract_order("first guess A B C D E, final answer: DEABC") == "DEABC"
    assert extract_order("A story. B A C") is None, "four labels are no answer"
    assert extract_order("A A B C D") is None, "labels must be distinct"
    task = get_task("reorder")
    ex = make_splits(task, SplitSizes(1, 0, 0, 1), 0)["test"][0]
    right, wrong = " ".join(ex.answer), " ".join(reversed(ex.answer))
    rewards = task.reward([right, wrong, "", "%%%%\x00 zzz"], [ex] * 4)
    assert rewards[0] == 1.0 and 0 < rewards[1] < 1 and rewards[2:] == [0.0, 0.0]
    assert task.check(task.extract(right), ex) and not task.check(task.extract(wrong), ex)


@needs_gym  # the default text ships with reasoning-gym
def test_reorder_splits_are_reproducible_and_test_sentences_never_reach_selection():
    a, b = _ids(get_task("reorder")), _ids(get_task("reorder"))
    assert a == b
    assert _ids(get_task("reorder"), seed=1) != a
    pools = get_task("reorder").pools()
    sentences = lambda ex: {line[3:] for line in ex.prompt.splitlines() if line[:3] in {f"{c}. " for c in "ABCDE"}}  # noqa: E731
    train = set().union(*(sentences(e) for e in pools["train"]))
    test = set().union(*(sentences(e) for e in pools["test"]))
    assert len(pools["test"]) >= 64 and len(pools["train"]) >= 128, "the default split sizes must fit"
    assert not (train & test), "a test sentence was shown during selection"
    assert all(len(sentences(e)) == 5 for e in pools["test"])
    assert all(sorted(e.answer) == list("ABCDE") and e.answer != "ABCDE" for e in pools["train"] + pools["test"]), (
        "gold is a shuffle, never the identity"
    )


def test_reorder_on_a_user_text(tmp_path):
    story = tmp_path / "story.txt"
    story.write_text(" ".join(f"Sentence number {i} happened on day {i}." for i in range(80)))
    task = get_task(f"reorder:{story}:block=10")
    ex = task.pools()["train"][0]
    shown = {line[0]: line[3:] for line in ex.prompt.splitlines() if line[:3] in {f"{c}. " for c in "ABCDE"}}
    days = [int(shown[label].split()[2]) for label in ex.answer]
    assert days == sorted(days) and days[-1] - days[0] == 4, "gold order = five consecutive sentences in text order"
    assert get_task(f"reorder:{story}").signature() != get_task(f"reorder:{story}:seed=1").signature()
    (tmp_path / "short.txt").write_text("One. Two. Three.")
    with pytest.raises(CorpError, match="needs a longer text"):
        get_task(f"reorder:{tmp_path / 'short.txt'}").pools()
    (tmp_path / "latin1.txt").write_bytes(b"Line one.\nCaf\xe9 two.\n")
    with pytest.raises(CorpError, match="latin1.txt' line 2 is not UTF-8"):
        get_task(f"reorder:{tmp_path / 'latin1.txt'}").pools()


def test_sentence_splitter():
    assert split_sentences('Mr. Smith came. "Stop!" he said. It was 3 p.m. now? Yes.') == [
        "Mr. Smith came.",
        '"Stop!" he said.',
        "It was 3 p.m. now?",
        "Yes.",
    ]


# ---------------------------------------------------------------- reasoning-gym


@needs_gym
@pytest.mark.parametrize("spec", RG_TASKS)
def test_rg_splits_reproducible_across_processes(spec):
    task = get_task(spec)
    a = _ids(task)
    assert a == _ids(get_task(spec)) and _ids(get_task(spec), seed=1) != a
    code = (
        "import json, sys; from corp.evaluate.tasks import get_task, make_splits, SplitSizes, SPLITS\n"
        f"sp = make_splits(get_task({spec!r}), SplitSizes(8, 4, 4, 8), 0)\n"
        "print(json.dumps({s: [[e.id, e.prompt, e.answer] for e in sp[s]] for s in SPLITS}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == {s: [list(x) for x in a[s]] for s in SPLITS}, (
        "another process (other hash seed) drew other splits"
    )


@needs_gym
@pytest.mark.parametrize("spec", RG_TASKS)
def test_rg_reward_on_hand_made_completions(spec):
    task = get_task(spec)
    ex = make_splits(task, SplitSizes(1, 0, 0, 0), 0)["support"][0]
    right = f"Let me think.\n<answer>{ex.answer}</answer>"
    untagged = f"Let me think.\nThe answer is {ex.answer}"  # extract=fallback: the last number / line
    wrong = "<answer>this is not it 12345</answer>"
    rewards = task.reward([right, untagged, wrong, "", "\x00<answer"], [ex] * 5)
    assert rewards[0] == 1.0 and rewards[2] < 1.0 and rewards[3:] == [0.0, 0.0]
    assert task.check(task.extract(right), ex) and not task.check(task.extract(wrong), ex)
    strict = get_task(spec.replace(",extract=fallback", ""))
    assert strict.extract(untagged) is None and strict.reward([untagged, right], [ex, ex]) == [0.0, 1.0], (
        "the gym's own extraction needs <answer> tags"
    )
    assert rewards[1] == 1.0, "numeric gold: the fallback takes the last number"
    assert task.extract(f"Let me think.\n{ex.answer}") == ex.answer


@needs_gym
def test_rg_options_and_errors():
    task = get_task("rg:basic_arithmetic:min_terms=2,max_terms=2,operators=+|-,max_new_tokens=16")
    assert task.options["operators"] == ("+", "-") and task.max_new_tokens == 16
    assert task.signature()["reasoning_gym"] == "0.1.25"
    assert get_task("rg:basic_arithmetic:seed=1").signature() != get_task("rg:basic_arithmetic").signature()
    with pytest.raises(CorpError, match="no dataset 'nope'"):
        get_task("rg:nope")
    with pytest.raises(CorpError, match="no option.*colour"):
        get_task("rg:basic_arithmetic:colour=red")
    with pytest.raises(CorpError, match="seed must be an integer"):
        get_task("rg:basic_arithmetic:seed=abc")
    with pytest.raises(CorpError, match="min_terms='x' is not a int"):
        get_task("rg:basic_arithmetic:min_terms=x")
    rows = {r["task"]: r["description"] for r in list_tasks()}
    assert (
        "rg:basic_arithmetic" in rows and "rg:countdown" in rows and len([t for t in rows if t.startswith("rg:")]) > 50
    )


def test_corp_tasks_says_how_to_install_the_gym_when_missing(monkeypatch):
    import corp.evaluate.tasks.rg

    monkeypatch.setattr(corp.evaluate.tasks.rg, "available", lambda package: package != "reasoning-gym")
    rows = {r["task"]: r["description"] for r in list_tasks()}
    assert "pip install 'corp[reasoning-gym]'" in rows["rg:NAME"]
    assert not [t for t in rows if t.startswith("rg:") and t != "rg:NAME"]


# ---------------------------------------------------------------- through the CLI, embedded model


def corp_cli(*args, cwd):
    env = {**os.environ, "CORP_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "corp.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=900
    )


def _two_specialists(task: str, tmp_path, *extra):
    run = tmp_path / "run"
    res = corp_cli(
        "score",
        "--task",
        task,
        "--population",
        "2",
        "--n-support",
        "4",
        "--n-probe",
        "0",
        "--n-validation",
        "0",
        "--n-test",
        "0",
        "--threads",
        "1",
        "--sigmas",  # pinned: the default calibration would cost ten passes for a population of two
        "0.002",
        "--output-dir",
        str(run),
        *extra,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "population.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["rewards"]) == 4 for r in rows)
    return rows, res


@pytest.mark.slow
@pytest.mark.embedded
@needs_gym
def test_rg_two_specialists_through_the_cli(tmp_path):
    rows, _ = _two_specialists(RG_TASKS[0], tmp_path)
    assert all(0.0 <= x <= 1.0 for r in rows for x in r["rewards"])


@pytest.mark.slow
@pytest.mark.embedded
@needs_gym
def test_reorder_two_specialists_through_the_cli(tmp_path):
    rows, _ = _two_specialists("reorder:max_new_tokens=16", tmp_path)
    assert all(0.0 <= x <= 1.0 for r in rows for x in r["rewards"])


@pytest.mark.slow
@pytest.mark.embedded
def test_custom_csv_with_mapping_per_completion_reward_and_stop_through_the_cli(tmp_path):
    (tmp_path / "qa.csv").write_text(
        "question,solution\n" + "".join(f"What is {i} plus {i}?,{2 * i}\n" for i in range(1, 9))
    )
    (tmp_path / "my_reward.py").write_text(
        "def reward(completion, answer, **columns):\n"
        "    assert '\\n' not in completion  # the stop string cut the completion\n"
        "    return 10.0 if answer in completion else -1.0\n"
    )
    rows, _ = _two_specialists(
        "jsonl:qa.csv:prompt=question,answer=solution,max_new_tokens=20,stop=\\n",
        tmp_path,
        "--reward",
        "my_reward:reward",
    )
    assert {x for r in rows for x in r["rewards"]} <= {10.0, -1.0}
    assert all(r["reward_errors"] == 0 for r in rows)


@pytest.mark.embedded
def test_a_reward_that_always_raises_stops_corp_score_with_one_line(tmp_path):
    (tmp_path / "broken_reward.py").write_text("def reward(completions, **kw):\n    raise KeyError('solution')\n")
    res = corp_cli(
        "score",
        "--population",
        "2",
        "--n-support",
        "4",
        "--n-probe",
        "0",
        "--n-validation",
        "0",
        "--n-test",
        "0",
        "--threads",
        "1",
        "--task",
        "arith:max_new_tokens=8",
        "--reward",
        "broken_reward:reward",
        "--output-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "broken_reward:reward" in errors[0] and "KeyError: 'solution'" in errors[0], res.stderr[
        -3000:
    ]
    assert "Traceback" not in res.stderr
