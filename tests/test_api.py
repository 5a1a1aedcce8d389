"""The Python API (corp/api.py): methods run from Python on a list of dicts or a `datasets.Dataset`
with TRL's reward functions, unchanged; the result carries the report, the run directory and the
saved model; the rows equal the CLI's for the same options; bad input is one line."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corp.api import make_config, task_for
from corp.errors import CorpError
from corp.evaluate.rewards import compute_rewards, register_reward, resolve_reward
from corp.evaluate.tasks import get_task


# TRL's own examples, copied unchanged from TRL's documentation, "Using a custom reward function"
# (https://huggingface.co/docs/trl/main/en/grpo_trainer, docs/source/grpo_trainer.md of
# huggingface/trl; Apache-2.0): "Example 3: Reward completions based on a reference" (standard format,
# a `ground_truth` column) and "Example 2: Reward completions with a specific format" (conversational).
def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


# "Example 5: Asynchronous reward functions", same page
async def async_reward_func(prompts, completions, **kwargs):
    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)
    await asyncio.sleep(0.01)
    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0
    return [1.0 if completion else 0.0 for completion in completions]


# end of TRL's examples


def text_checksum(completions, **_):
    """A reward that moves whenever the text moves (a random tiny model never earns TRL's)."""
    return [(sum(map(ord, c)) % 97) / 96 for c in completions]


ROWS = [{"prompt": f"Problem: what is {i} + {i}? Solution:", "ground_truth": str(2 * i)} for i in range(16)]
SMALL = dict(n_support=4, n_probe=2, n_validation=2, n_test=4, max_completion_length=4, batch_size=8, seed=1)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))  # datasets are written there


def _examples(spec: str, pool: str = "train"):
    return get_task(spec).pools()[pool]


# ---------------------------------------------------------------- rewards, without a model


def test_trls_reward_function_gets_the_dataset_columns_as_trl_passes_them():
    spec, conversational, _ = task_for(ROWS)
    assert not conversational
    exs = [e for e in _examples(spec) if e.columns["ground_truth"] in ("2", "4")]
    fn = resolve_reward(register_reward([reward_func]))
    completions = [r" The solution is \boxed{2}.", r" The solution is \boxed{6}."]
    # TRL's example on its own inputs gives [1.0, 0.0]; here the ground truths come from the dataset's column
    assert compute_rewards(get_task(spec), completions, exs, fn) == ([1.0, 0.0], 0)


def test_conversational_prompts_reach_trls_function_as_messages():
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in ROWS[:4]]
    spec, conversational, _ = task_for(rows)
    assert conversational
    exs = _examples(spec)[:2]
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen["prompt"], seen["completion"] = prompts[0], completions[0]
        return [0.0] * len(completions)

    fn = resolve_reward(register_reward([format_reward_func, spy], conversational=True))
    completions = [
        "<think>The sum of 1 and 2 is 3, which we multiply by 4 to get 12.</think><answer>(1 + 2) * 4 = 12</answer>",
        "The sum of 3 and 1 is 4, which we multiply by 2 to get 8. So (3 + 1) * 2 = 8.",
    ]
    assert compute_rewards(get_task(spec), completions, exs, fn) == ([1.0, 0.0], 0)
    assert seen["prompt"] == [{"role": "user", "content": exs[0].prompt}]
    assert seen["completion"] == [{"role": "assistant", "content": completions[0]}]


def test_reward_weights_sum_like_trl_and_a_none_is_left_out():
    spec, _, _ = task_for(ROWS)
    exs = _examples(spec)[:3]

    def first(completions, **kwargs):
        return [1.0, None, None]

    def second(completions, **kwargs):
        return [1.0, 2.0, None]

    fn = resolve_reward(register_reward([first, second], [2.0, 0.5]))
    with pytest.warns(UserWarning, match="failed on 1 of 3"):  # no function gave one: scored 0, counted
        assert compute_rewards(get_task(spec), ["a", "b", "c"], exs, fn) == ([2.5, 1.0, 0.0], 1)
    with pytest.raises(CorpError, match="reward_weights has 1 values for 2"):
        register_reward([first, second], [1.0])


def test_an_async_reward_is_awaited_as_trl_awaits_it():
    spec, _, _ = task_for(ROWS)
    fn = resolve_reward(register_reward([async_reward_func]))
    assert compute_rewards(get_task(spec), ["x", ""], _examples(spec)[:2], fn) == ([1.0, 0.0], 0)


def test_a_changed_function_is_another_reward_in_cache_keys():
    def f(completions, **kwargs):
        return [1.0] * len(completions)

    a = register_reward([f])

    def f(completions, **kwargs):  # noqa: F811 -- the same name, other code
        return [0.0] * len(completions)

    assert register_reward([f]) != a
    assert register_reward([f], [2.0]) != register_reward([f])


def test_closures_over_other_values_are_other_rewards_and_an_unstable_value_is_refused():
    """Two closures of one function over other values score differently, so they must key apart;
    a carried object that prints a memory address cannot key a cache at all."""
    import functools

    def make(target):
        def closeness(completions, **kw):
            return [float(c == target) for c in completions]

        return closeness

    assert register_reward([make("1")]) != register_reward([make("2")])
    assert register_reward([make("1")]) == register_reward([make("1")])

    def scaled(completions, scale=1.0, **kw):
        return [scale * len(c) for c in completions]

    assert register_reward([functools.partial(scaled, scale=2.0)]) != register_reward([scaled])
    with pytest.raises(CorpError, match="stable repr"):
        register_reward([make(object())])


def test_eval_dataset_is_the_test_pool():
    spec, _, n = task_for(ROWS[:10], ROWS[10:])
    assert n == 6 and ":test=" in spec
    task = get_task(spec)
    pools = task.pools()
    assert [e.prompt for e in pools["test"]] == [r["prompt"] for r in ROWS[10:]]
    assert all(e.id.startswith("test-") for e in pools["test"])  # never the train file's ids
    assert "test" in task.signature() and "test" not in get_task(spec.partition(":test=")[0]).signature()


# ---------------------------------------------------------------- bad input: one line


def test_an_unknown_option_is_one_line_naming_the_valid_ones():
    with pytest.raises(CorpError) as err:
        make_config("randopt", populaton=3)
    msg = str(err.value)
    assert "populaton" in msg and "did you mean 'population'" in msg and "sigmas" in msg and "\n" not in msg


def test_messages_name_options_as_parameters_and_the_cli_keeps_its_flags(capsys):
    """Errors and warnings leaving the Python API say `top_k`, not `--top-k`, whichever module wrote them
    (a literal flag or corp.config.flag); the CLI's own messages are unchanged."""
    import warnings

    from typer.testing import CliRunner

    from corp.cli import app
    from corp.config import in_python_terms

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_config("randopt", population=2)
    assert [str(w.message) for w in caught] == ["top_k is 1,4,16 by default; with population 2 it is 1,2"]
    for options, said in [
        ({"n_probe": -1}, "n_probe must be >= 0, got -1"),  # corp.config.flag
        ({"race": "fast"}, "unknown race 'fast'; choose off or halving"),  # a literal flag
        ({"population": "3"}, "population is '3' (str); expected an integer"),
    ]:
        with pytest.raises(CorpError) as err:
            make_config("randopt", **options)
        assert str(err.value) == said
    gloss = "use another --output-dir (output_dir= in Python); see `corp randopt --help`"
    assert in_python_terms(gloss) == "use another output_dir; see `corp randopt --help`"
    out = CliRunner().invoke(app, ["randopt", "--n-probe", "-1"])
    assert "error: --n-probe must be >= 0, got -1" in out.output


def test_a_dataset_too_small_is_named_as_passed_and_only_the_splits_the_method_reads_are_asked_for():
    import corp

    with pytest.raises(CorpError) as err:  # RandOpt reads support and test: probe and validation are not drawn
        corp.train_randopt("unused", ROWS, reward_func, population=2)
    assert str(err.value) == (
        "train_dataset has 16 examples for selection, fewer than the requested test 128 + support 64; "
        "lower the n_* split sizes"
    )
    with pytest.raises(CorpError, match="^eval_dataset has 4 test examples; n_test 5 is too large$"):
        held_out = [{"prompt": f"held out {i}", "ground_truth": "0"} for i in range(4)]
        corp.train_randopt("unused", ROWS, reward_func, eval_dataset=held_out, n_test=5, population=2)


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"question": "q"}], "no column 'prompt'.*question.*prompt_column"),
        ([{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}], "roles.*system"),
        ([], "no rows"),
        ([{"prompt": "  "}], "row 0.*empty"),
        ({"train": type("D", (), {"column_names": ["prompt"]})()}, "DatasetDict.*ds\\['train'\\]"),
    ],
)
def test_a_dataset_corp_cannot_take_is_one_line(rows, match):
    import corp

    with pytest.raises(CorpError, match=match):
        corp.train_randopt("unused", rows, reward_func)


def test_a_model_object_is_a_type_error_naming_what_to_pass(tiny_dir):
    """Not `OSError: File name too long: 'LlamaForCausalLM(...'` (issue 57)."""
    from transformers import AutoModelForCausalLM

    import corp

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with pytest.raises(TypeError, match=r"model is a LlamaForCausalLM object.*save_pretrained\(DIR\)"):
        corp.train_randopt(model, ROWS, reward_func)


def test_run_dir_and_output_dir_together_are_refused_naming_both(tmp_path):
    """One option under two names: the API wrote to output_dir and dropped run_dir (issue 57)."""
    with pytest.raises(ValueError, match="run_dir=.*output_dir=.*give only output_dir"):
        make_config("randopt", run_dir=str(tmp_path / "a"), output_dir=str(tmp_path / "b"))
    assert make_config("randopt", output_dir=str(tmp_path / "b")).run_dir == str(tmp_path / "b")
    assert make_config("randopt", max_new_tokens=4, max_completion_length=4).max_new_tokens == 4  # one value


def test_a_read_only_cache_is_one_line_naming_corp_cache(tmp_path, monkeypatch):
    import os

    if os.geteuid() == 0:
        monkeypatch.setattr("corp.api.atomic_write_text", _read_only)  # root writes anywhere
    else:
        (tmp_path / "ro").mkdir(mode=0o555)
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "ro" / "cache"))
    with pytest.raises(CorpError, match="train_dataset cannot be written to corp's cache.*set CORP_CACHE") as err:
        task_for(ROWS)
    assert "\n" not in str(err.value)


def _read_only(path, text):
    raise PermissionError(13, "Permission denied", str(path))


def test_an_answer_of_the_wrong_type_names_the_dataset_row_and_column():
    """Not corp's cache file and its line (issue 57)."""
    rows = [{"prompt": r["prompt"], "answer": r["ground_truth"]} for r in ROWS[:3]] + [{"prompt": "p", "answer": ["4"]}]
    with pytest.raises(CorpError, match="train_dataset row 3: column 'answer'.*list") as err:
        task_for(rows)
    assert "datasets" not in str(err.value) and ".jsonl" not in str(err.value)


def test_a_python_reward_on_ray_is_refused_before_any_work():
    import corp

    with pytest.raises(CorpError, match="module:function"):
        corp.train_randopt("unused", ROWS, reward_func, executor="ray")


def test_import_corp_stays_light():
    code = "import sys, corp; assert 'torch' not in sys.modules; assert callable(corp.train_corp)"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- the methods, on a tiny model


def _rows_of(run_dir: Path) -> list[dict]:
    keep = ("seed", "sigma", "split", "reward", "rewards", "correct", "answers", "generated_tokens")
    rows = [json.loads(line) for line in (run_dir / "population.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in keep} for r in rows]


def test_randopt_from_python_is_the_clis_run(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    import corp
    from corp.cli import app

    options = dict(population=3, sigmas=[0.05], top_k=[1, 2], **SMALL)
    result = corp.train_randopt(str(tiny_dir), ROWS, text_checksum, run_dir=str(tmp_path / "py"), **options)
    assert result.run_dir == tmp_path / "py" and result.model_path is None  # a vote is not one model
    assert [r["method"] for r in result.rows] == ["base", "randopt-top1", "randopt-vote@2"]
    assert len(result.population()) == 3

    flags = [
        f"--{k.replace('_', '-')}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in options.items()
    ]
    args = ["randopt", "--model", str(tiny_dir), "--task", result.config.task, "--run-dir", str(tmp_path / "cli")]
    args += ["--reward", f"{Path(__file__)}:text_checksum", *flags]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    cli = json.loads((tmp_path / "cli" / "report.json").read_text())
    assert _rows_of(tmp_path / "cli") == _rows_of(result.run_dir)  # same seeds, same completions, same rewards
    assert len({r["reward"] for r in _rows_of(result.run_dir)}) > 1  # the rewards differ between specialists
    assert [(r["method"], r["accuracy"]) for r in cli["rows"]] == [(r["method"], r["accuracy"]) for r in result.rows]
    # ROWS have no answer column: the table is of rewards, with 0 labelled and the 4 support prompts scored
    assert result["measure"] == "reward" and "test reward" in result.table and "test acc" not in result.table
    top1 = result.rows[1]
    assert top1["labelled_examples"] == 0 and top1["scored_prompts"] == 4 and top1["reward"] is not None
    assert "randopt-top1 vs base: reward " in result.table


def test_consolidate_on_a_dataset_saves_a_model_transformers_loads(tiny_dir, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    import corp

    train, held_out = Dataset.from_list(ROWS[:12]), Dataset.from_list(ROWS[12:])
    result = corp.train_corp(
        str(tiny_dir),
        train,
        [reward_func, text_checksum],  # TRL's list of functions, unchanged
        eval_dataset=held_out,
        reward_weights=[1.0, 0.5],
        population=4,
        sigmas=[0.05],
        alphas=[1.0, 2.0],
        top_k=[1, 2],
        gate_z=-10.0,  # forced open: a random update on a random model
        run_dir=str(tmp_path / "corp"),
        **{**SMALL, "n_test": None},
    )
    assert result.model_path == tmp_path / "corp" / "model"
    AutoModelForCausalLM.from_pretrained(result.model_path)
    splits = json.loads((result.run_dir / "splits.json").read_text())
    assert len(splits["test"]) == 4 and all(i.startswith("test-") for i in splits["test"])  # all of eval_dataset
    assert (result.run_dir / "recipe.json").is_file() and result["method"] == "consolidate"
    # the table speaks Python: it printed 'noise scales fixed by --sigmas' to a caller who passed sigmas=
    assert "noise scales fixed by sigmas: 0.05" in result.table
    assert not re.search(r"(?<![\w-])--[a-z]", result.table), result.table


@pytest.mark.parametrize("name", ["es", "grpo"])
def test_es_and_grpo_from_python_save_a_model(name, tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    import corp
    from corp.methods import REGISTRY

    smoke = {k: v for k, v in REGISTRY[name].smoke.items() if k not in SMALL}
    train = {"es": corp.train_es, "grpo": corp.train_grpo}[name]
    result = train(str(tiny_dir), ROWS, reward_func, output_dir=str(tmp_path / name), **SMALL, **smoke)
    assert result.method == name and result.model_path == tmp_path / name / "model"
    assert "test reward" in result.table and "test acc" not in result.table  # ROWS have no gold answers
    AutoModelForCausalLM.from_pretrained(result.model_path)


def test_the_readmes_python_snippet_shows_what_it_ends_with_when_run_as_a_script():
    """Pasted into a script, a bare expression (`result.model_path`) prints nothing (issue 56): every
    top-level expression of the README's Python snippets is a call (print, a method's train function)."""
    import ast

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert snippets, "the README has a Python snippet"
    for code in snippets:
        bare = [
            ast.unparse(s)
            for s in ast.parse(code).body
            if isinstance(s, ast.Expr) and not isinstance(s.value, ast.Call)
        ]
        assert bare == [], f"prints nothing in a script: {bare}"
