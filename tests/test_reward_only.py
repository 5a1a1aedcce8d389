"""Reward-only tasks (a reward function, a dataset with no answer column: TRL's usual case): the report,
its table and the model card measure the reward, with paired intervals against the base, since every
accuracy would read 0; and nothing is called labelled."""

from __future__ import annotations

import json

from corp.algorithms.stats import PerExample
from corp.cards import _results_lines, _weights_lines
from corp.evaluate.population import vote_rewards
from corp.evaluate.tasks import get_task
from corp.runtime.ledger import Ledger
from corp.runtime.runs import ReportRow, format_rows, write_report

IDS = ["a", "b", "c", "d"]


def _rows() -> list[ReportRow]:
    def row(name, rewards, labelled):
        return ReportRow(name, 0.0, 1, Ledger(10), labelled, PerExample([0] * 4, IDS), rewards=PerExample(rewards, IDS))

    return [row("base", [0.1, 0.2, 0.3, 0.4], 0), row("randopt-top1", [0.5, 0.6, 0.7, 0.8], 16)]


def test_a_task_without_gold_answers_is_not_graded(tmp_path):
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}", "answer": ""}) + "\n" for i in range(4)))
    (tmp_path / "g.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}", "answer": i}) + "\n" for i in range(4)))
    assert not get_task(f"jsonl:{tmp_path / 'r.jsonl'}").graded()
    assert get_task(f"jsonl:{tmp_path / 'g.jsonl'}").graded() and get_task("arith").graded()


def test_the_report_table_and_card_measure_the_reward_with_its_paired_interval(tmp_path):
    rows = _rows()
    report = write_report(tmp_path, "randopt", "m", "jsonl:x", rows, [("randopt-top1", "base")], IDS, "reward")
    assert report["measure"] == "reward"
    top1 = report["rows"][1]
    assert top1["reward"] == 0.65 and top1["labelled_examples"] == 0 and top1["scored_prompts"] == 16
    (c,) = report["comparisons"]
    assert c["measure"] == "reward" and abs(c["difference"] - 0.4) < 1e-9 and c["ci95"][0] > 0.39

    table = format_rows(rows, report["comparisons"], measure="reward")
    assert "test reward" in table and "test acc" not in table
    assert [line.split()[1:5] for line in table.splitlines()[1:3]] == [
        ["0.250", "1", "0", "0"],
        ["0.650", "1", "0", "16"],
    ]
    assert "randopt-top1 vs base: reward +0.400 (paired 95% CI" in table

    card = "\n".join(_results_lines(report, "jsonl:x"))
    assert "| randopt-top1 | 0.650 | 1 | 0 | 16 |" in card and "test accuracy" not in card and "McNemar" not in card
    said = "\n".join(_weights_lines("es", None, report))  # the last row is the saved model's
    assert "Their test reward is row `randopt-top1` of the results below: 0.650" in said


def test_a_graded_report_is_as_before(tmp_path):
    report = write_report(tmp_path, "randopt", "m", "arith", _rows(), [("randopt-top1", "base")], IDS)
    assert "measure" not in report and report["rows"][1]["labelled_examples"] == 16
    assert report["comparisons"][0]["difference"] == 0.0 and "mcnemar_p" in report["comparisons"][0]
    assert "test acc" in format_rows(_rows(), report["comparisons"])


def test_a_votes_reward_is_that_of_the_highest_ranked_completion_giving_its_answer():
    ranked = [
        {"answers": ["x", None], "rewards": [0.1, 0.2]},
        {"answers": ["y", None], "rewards": [0.3, 0.4]},
        {"answers": ["y", None], "rewards": [0.5, 0.6]},
    ]
    assert vote_rewards(ranked) == [0.3, 0.2]  # 'y' wins example 0 (its first voter); no answer: the top-1's


# TRL's own example, "Example 1: Reward longer completions" of TRL's GRPO trainer documentation
# (https://huggingface.co/docs/trl/main/en/grpo_trainer; Apache-2.0), unchanged
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def test_trls_reward_len_on_conversational_prompts_is_one_warning_naming_it(tiny_dir, tmp_path, monkeypatch):
    import warnings

    import corp

    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    rows = [{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(12)]
    small = dict(n_support=4, n_probe=0, n_validation=0, n_test=2, max_completion_length=4, batch_size=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        corp.train_randopt(str(tiny_dir), rows, reward_len, population=2, sigmas=[0.05], top_k=[1], **small)
    said = [str(w.message) for w in caught if "no signal" in str(w.message)]
    # a completion is a list of one message, as in TRL: len() is 1, the reward always -19
    assert said == [said[0]] and said[0].startswith("the reward 'reward_len' returned -19.0 for every completion")


def test_a_reward_that_varies_or_the_tasks_own_check_is_no_warning():
    import warnings

    from corp.evaluate.scorer import warn_if_no_signal

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_no_signal("python:f@123", [{"rewards": [0.0, 1.0]}, {"rewards": [0.0, 0.0]}])
        warn_if_no_signal(None, [{"rewards": [0.0, 0.0]}, {"rewards": [0.0, 0.0]}])  # all wrong: the model's fault
        warn_if_no_signal("m:f", [{"rewards": [0.0, 0.0]}])  # one specialist: nothing to compare


def test_a_reward_that_ignores_the_completions_is_one_warning_naming_it():
    """Each example's reward the same for every specialist while their completions differ (a reward reading the
    prompt, not the answer): no signal, though its values vary across examples."""
    import warnings

    from corp.evaluate.scorer import warn_if_no_signal

    blind = [
        {"ids_hash": "s", "rewards": [3.0, 5.0], "completion_hashes": ["a", "b"]},
        {"ids_hash": "s", "rewards": [3.0, 5.0], "completion_hashes": ["c", "b"]},
        {"ids_hash": "r", "rewards": [3.0], "completion_hashes": ["d"]},  # a raced row: fewer examples
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_no_signal("python:by_prompt@1", blind)
    (said,) = [str(w.message) for w in caught]
    assert said.startswith("the reward 'by_prompt' gave all 3 specialists the same reward on each support example")
    assert "\n" not in said and "no signal" in said

    same_text = [{**r, "completion_hashes": ["a", "b"]} for r in blind[:2]]  # the noise changed nothing: not the reward
    varies = [blind[0], {**blind[1], "rewards": [3.0, 4.0]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_no_signal("python:f@1", same_text)
        warn_if_no_signal("python:f@1", varies)


def test_a_prompt_length_reward_through_the_api_is_one_warning(tiny_dir, tmp_path, monkeypatch):
    import warnings

    import corp

    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    rows = [{"prompt": "Count" + " to" * i + f" {i}."} for i in range(12)]

    def by_prompt(completions, prompts, **_):
        return [float(len(p)) for p in prompts]

    small = dict(n_support=4, n_probe=0, n_validation=0, n_test=2, max_completion_length=4, batch_size=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        corp.train_randopt(str(tiny_dir), rows, by_prompt, population=3, sigmas=[0.05], top_k=[1], **small)
    said = [str(w.message) for w in caught if "no signal" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("the reward 'by_prompt' gave all 3 specialists the same reward")


def test_corp_eval_on_a_reward_only_dataset_reports_its_greedy_reward(tiny_dir, tmp_path, monkeypatch):
    import corp

    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    rows = [{"prompt": f"Say {i}."} for i in range(6)]
    sizes = dict(n_test=4, n_support=0, n_probe=0, n_validation=0, max_completion_length=4)
    result = corp.train(
        "eval", str(tiny_dir), rows, lambda completions, **_: [len(c) / 4 for c in completions], **sizes
    )
    assert result["measure"] == "reward" and result.rows[0]["reward"] is not None
    assert f"greedy reward    {result.rows[0]['reward']:.3f}" in result.table and "accuracy" not in result.table
