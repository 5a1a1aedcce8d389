"""The Python API: every registered method from Python, on a `datasets.Dataset` (or a list of dicts)
with TRL-style reward functions.

    from corp import train_corp
    result = train_corp("smollm2-135m", dataset, reward_funcs=reward_func, population=16)
    result.model_path   # RUN_DIR/model, a Hugging Face model directory

`train(method, ...)` runs any registered method; `train_randopt`, `train_corp` (CoRP, the `consolidate`
command; `corp.methods.consolidate` is the algorithm's package), `train_es` and `train_grpo` are it for one.

One path with the CLI: options are the fields of the method's config dataclass (the CLI's flags with
`_` for `-`), built by `corp.config.load_config` as the CLI builds them, and run by `run(cfg)`, the
function `corp NAME` calls too. What this module adds is the translation of Python objects into the
config's strings:

- a dataset becomes a JSONL file in corp's cache (`$CORP_CACHE/datasets/<sha256>.jsonl`, named by its
  content) and the task `jsonl:PATH` (with `test=PATH2` for an `eval_dataset`), so a run records its
  data like any `--task jsonl:` run and the same rows give the same splits and cache keys;
- reward functions become one in-process reward (`corp.evaluate.rewards.register_reward`): TRL's
  `reward_funcs` (one or a list) and `reward_weights`, called as TRL calls them (`prompts`,
  `completions`, and every other column of the dataset by name). A function given as a string
  (`"my_rewards:reward_func"`) is passed by name, as `--reward` is.

Prompts are strings (TRL's standard format) or a single user message (TRL's conversational format:
`[{"role": "user", "content": ...}]`; the functions then get prompts and completions as message
lists). The gold answer, for the accuracy columns of reports and RandOpt's majority vote, is the
`answer` column (`answer_column=` names another); without one, accuracy is not meaningful, so the
report, its table and the model card measure the reward instead: each row's mean test reward, paired
intervals against the base, 0 labelled examples and the prompts each method scored by the reward
(report.json's `measure` is "reward", each row's `reward` and `scored_prompts`).

Errors and warnings from these functions name options as keyword parameters (`n_probe`, not the CLI's
`--n-probe`) and the data as `train_dataset` and `eval_dataset` (`corp.config.python_terms`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from corp.config import in_python_terms, load_config, python_terms, read_yaml_config, renamed_options
from corp.config import option_names as config_option_names
from corp.errors import CorpError
from corp.evaluate.rewards import register_reward
from corp.methods import Method, consolidate, es, get_method, grpo, methods, randopt
from corp.runtime.models import cache_dir, shown_datasets
from corp.runtime.runs import atomic_write_text, read_jsonl


@dataclass
class Result:
    """What a run returns: its report (the dict `report.json` holds), where it wrote, and its model."""

    method: str
    report: dict
    config: Any
    """The resolved config dataclass (what `RUN_DIR/config.yaml` holds)."""
    run_dir: Path | None
    model_path: Path | None
    """`RUN_DIR/model`, a Hugging Face model directory, for methods that save one (consolidate, es, grpo,
    ...); None for the others (RandOpt's top-K vote is an ensemble, not one model)."""

    @property
    def rows(self) -> list[dict]:
        """The report's rows (base, the method's models; accuracy and compute per row)."""
        return self.report.get("rows", [])

    @property
    def table(self) -> str:
        """What the CLI prints after the run, its options said as this API's parameters (`sigmas`, not `--sigmas`)."""
        return in_python_terms(get_method(self.method).summarise(self.report))

    def population(self) -> list[dict]:
        """The scored specialists (`population.jsonl`: seed, sigma, support reward, ...); [] when none."""
        path = self.run_dir / "population.jsonl" if self.run_dir else None
        return list(read_jsonl(path)) if path and path.exists() else []

    def __getitem__(self, key: str):
        return self.report[key]

    def __repr__(self) -> str:
        return f"Result(method={self.method!r}, run_dir='{self.run_dir}', model_path={_quoted(self.model_path)})"


def _quoted(path: Path | None) -> str:
    return "None" if path is None else f"'{path}'"


def run(cfg, method: str | Method | None = None, backend=None) -> Result:
    """Run a method's config (the CLI's path: `corp NAME` builds the config and calls this)."""
    m = method if isinstance(method, Method) else get_method(method or _method_of(cfg))
    report = m(cfg, backend)
    where = report.get("run_dir") or cfg.run_dir
    run_dir = Path(where) if where else None
    model = run_dir / "model" if run_dir is not None and m.model else None
    return Result(m.name, report, cfg, run_dir, model if model is not None and model.is_dir() else None)


def _method_of(cfg) -> str:
    for m in methods():
        if type(cfg) is m.config:
            return m.name
    raise CorpError(f"no registered method takes a {type(cfg).__name__}; pass method='NAME'")


# ---------------------------------------------------------------- options


def option_names(method: str) -> list[str]:
    """The options `method` takes from Python: the CLI's flags with `_` for `-` (TRL's names where TRL
    has the concept, `output_dir`, `max_steps`, ...). Field names and old names are taken too."""
    return list(config_option_names(get_method(method).config).values())


@python_terms()
def make_config(method: str, config: str | None = None, **options):
    """The method's config from its YAML file (`config=`, as `--config`) and options by field name:
    the CLI's `load_config`. An unknown name is one line listing the valid ones; every message names
    options as parameters (`n_probe`, not the CLI's `--n-probe`)."""
    cls = get_method(method).config
    valid = set(option_names(method)) | {f.name for f in fields(cls)} | set(renamed_options(cls))
    unknown = sorted(set(options) - valid)
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(valid), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise CorpError(
            f"corp {method}: unknown option(s) {', '.join(unknown)}{hint}; valid: {', '.join(option_names(method))}"
        )
    _refuse_two_names(cls, options)
    return load_config(cls, config, options)


def _refuse_two_names(cls: type, options: dict) -> None:
    """A field given under its own name and its option name with two values (`run_dir=A,
    output_dir=B`): one would silently win, so the pair is refused, as the CLI refuses
    `--run-dir A --output-dir B`. The same value under both names is one choice."""
    for field_name, option in config_option_names(cls).items():
        given = options.get(field_name), options.get(option)
        if option != field_name and None not in given and given[0] != given[1]:
            raise ValueError(
                f"{field_name}={options[field_name]!r} and {option}={options[option]!r} name one option "
                f"({field_name} is {option}'s field name); give only {option}"
            )


# ---------------------------------------------------------------- datasets


def _rows(dataset, what: str) -> list[dict]:
    if isinstance(dataset, Mapping):
        values = list(dataset.values())
        if values and all(hasattr(v, "column_names") for v in values):
            raise CorpError(f"{what} is a DatasetDict (splits {', '.join(dataset)}); pass one split, e.g. ds['train']")
        if not (values and all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1):
            raise CorpError(
                f"{what} is a mapping but not of columns of equal length; pass a datasets.Dataset or a list of dicts"
            )
        dataset = [dict(zip(dataset, cells)) for cells in zip(*values)]  # {column: [values]}, Dataset.from_dict's input
    if hasattr(dataset, "to_list"):
        rows = dataset.to_list()
    elif isinstance(dataset, Iterable) and not isinstance(dataset, (str, bytes)):
        rows = list(dataset)
    else:
        raise CorpError(f"{what} is a {type(dataset).__name__}; pass a datasets.Dataset or a list of dicts")
    if not rows:
        raise CorpError(f"{what} has no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise CorpError(f"{what} row {i} is a {type(row).__name__}, not a dict of columns")
    return [dict(r) for r in rows]


def _prompt_text(value, what: str, i: int, column: str) -> tuple[str, bool]:
    """(the prompt as corp's user message, whether it came in TRL's conversational format)."""
    if isinstance(value, str) and value.strip():
        return value, False
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], Mapping):
        if value[0].get("role") == "user" and isinstance(value[0].get("content"), str):
            return value[0]["content"], True
    if isinstance(value, str):
        raise CorpError(f"{what} row {i}: column '{column}' is empty; every example needs a prompt")
    roles = (
        [m.get("role") for m in value]
        if isinstance(value, list) and all(isinstance(m, Mapping) for m in value)
        else None
    )
    got = f"messages with roles {roles}" if roles is not None else type(value).__name__
    raise CorpError(
        f"{what} row {i}: column '{column}' is {got}; corp's prompts are a string or one user message "
        "([{'role': 'user', 'content': ...}]), the chat template being applied by the backend"
    )


def _write_dataset(dataset, what: str, prompt_column: str, answer_column: str | None) -> tuple[Path, bool, int]:
    """(the dataset as a JSONL file in corp's cache, named by its content; conversational?; rows)."""
    rows = _rows(dataset, what)
    have = list(rows[0])
    if prompt_column not in rows[0]:
        raise CorpError(f"{what} has no column '{prompt_column}' (columns: {', '.join(have)}); pass prompt_column=")
    gold = answer_column if answer_column is not None else ("answer" if "answer" in rows[0] else None)
    if gold is not None and gold not in rows[0]:
        raise CorpError(f"{what} has no column '{gold}' (columns: {', '.join(have)}); pass answer_column=")
    lines, formats = [], set()
    for i, row in enumerate(rows):
        text, conversational = _prompt_text(row.get(prompt_column), what, i, prompt_column)
        formats.add(conversational)
        answer = row.get(gold, "") if gold is not None else ""
        if isinstance(answer, (Mapping, list, tuple)):  # the task would name corp's cache file, not this row
            raise CorpError(
                f"{what} row {i}: column '{gold}' (the gold answer) is a {type(answer).__name__}; an answer is a "
                "string or a number (pass answer_column= to name another column)"
            )
        record = {
            "prompt": text,
            "answer": "" if answer is None else answer,
            **{k: v for k, v in row.items() if k not in (prompt_column, "prompt", "answer")},
        }
        try:
            lines.append(json.dumps(record, sort_keys=True, ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            raise CorpError(
                f"{what} row {i} holds a value corp cannot store as JSON ({exc}); keep columns to text, numbers, "
                "lists and dicts"
            ) from None
    if len(formats) > 1:
        raise CorpError(f"{what} mixes string prompts and message lists; use one format")
    text = "".join(line + "\n" for line in lines)
    return _store(text, what), formats.pop(), len(rows)


def _store(text: str, what: str) -> Path:
    """The dataset's JSONL in corp's cache, named by its content (written once)."""
    path = cache_dir() / "datasets" / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.jsonl"
    if path.is_file():
        return path
    try:
        atomic_write_text(path, text)
    except OSError as exc:  # a read-only or full cache: the user can only act on CORP_CACHE
        raise CorpError(
            f"{what} cannot be written to corp's cache '{path.parent}' ({exc.strerror or exc}); set CORP_CACHE "
            "to a writable directory (os.environ['CORP_CACHE'] = DIR before the call)"
        ) from None
    return path


def task_for(
    train_dataset, eval_dataset=None, prompt_column: str = "prompt", answer_column: str | None = None
) -> tuple[str, bool, int | None]:
    """(the `--task` spec of a dataset, whether it is conversational, the eval dataset's size)."""
    path, conversational, _ = _write_dataset(train_dataset, "train_dataset", prompt_column, answer_column)
    if eval_dataset is None:
        return f"jsonl:{path}", conversational, None
    test, conv_eval, n = _write_dataset(eval_dataset, "eval_dataset", prompt_column, answer_column)
    if conv_eval != conversational:
        raise CorpError("train_dataset and eval_dataset have prompts in different formats; use one")
    return f"jsonl:{path}:test={test}", conversational, n


# ---------------------------------------------------------------- the methods


@python_terms()
def train(
    method: str,
    model: str | None = None,
    train_dataset=None,
    reward_funcs: Callable | str | Sequence[Callable | str] | None = None,
    *,
    eval_dataset=None,
    reward_weights: Sequence[float] | None = None,
    prompt_column: str = "prompt",
    answer_column: str | None = None,
    config: str | None = None,
    backend=None,
    **options,
) -> Result:
    """Run the registered method `method` (`corp --help` lists them) and return its `Result`.

    model: an alias, a local Hugging Face directory or a hub id (the CLI's `--model`).
    train_dataset: a `datasets.Dataset` or a list of dicts with a prompt column; support, probe and
        validation (and, without `eval_dataset`, test) splits are drawn from it with `split_seed`.
        None: the `task` option names a built-in task (`arith`, `gsm8k`, ...) instead.
    reward_funcs: a function `(prompts, completions, **columns) -> list[float]` (TRL's), corp's
        per-completion `(completion, answer, **columns) -> float`, a `"module:function"` string, or a
        list of them; None: the task's own check (correct = 1).
    eval_dataset: the test pool (the test split is all of it unless `n_test` is given).
    reward_weights: one weight per function (TRL's); the reward is the weighted sum.
    config: a YAML file of options (the CLI's `--config`); keyword options override it.
    options: the method's config fields (the CLI's flags, `_` for `-`): `population=16`,
        `sigmas=[1e-3]`, `run_dir="runs/x"`, ...; an unknown name is one error line listing them.
    backend: the `backend` option as a string (`"hf"`, `"vllm"`, `"auto"`), or a ready engine object to reuse.

    Errors and warnings name options as these parameters (`n_probe`, not the CLI's `--n-probe`) and the
    datasets as `train_dataset` and `eval_dataset`.
    """
    backend = _backend_option(backend, options)
    if model is not None:
        options["model"] = _model_name(model)
    if train_dataset is not None:
        if "task" in options:
            raise CorpError("give train_dataset or the task option, not both")
        task, conversational, n_eval = task_for(train_dataset, eval_dataset, prompt_column, answer_column)
        with python_terms() as names:  # the terms `train` runs within: they name its data as its parameters
            names.update(_data_names(task))
        options["task"] = task
        if n_eval is not None and options.get("n_test") is None and "n_test" not in _yaml_keys(config):
            options["n_test"] = n_eval  # TRL evaluates on all of eval_dataset
    elif eval_dataset is not None:
        raise CorpError("eval_dataset needs a train_dataset")
    else:
        conversational = False
    if reward_funcs is not None:
        if "reward" in options:
            raise CorpError("give reward_funcs or the reward option, not both")
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        by_name = len(funcs) == 1 and isinstance(funcs[0], str) and reward_weights is None and not conversational
        options["reward"] = funcs[0] if by_name else register_reward(funcs, reward_weights, conversational)
        if not by_name and options.get("executor") == "ray":
            raise CorpError(
                "executor='ray': Ray workers import the reward by name; pass reward_funcs as one "
                "'module:function' string (no reward_weights), or run with executor='local'"
            )
    elif reward_weights is not None:
        raise CorpError("reward_weights needs reward_funcs")
    return run(make_config(method, config, **options), method, backend)


def _data_names(task: str) -> dict[str, str]:
    """{the name errors show a dataset by (`dataset-<hash>`): the parameter the user passed it as}."""
    path, _, test = task.removeprefix("jsonl:").partition(":test=")
    names = {shown_datasets(path): "train_dataset"}
    if test:
        names[shown_datasets(test)] = "eval_dataset"
    return names


def _model_name(model) -> str:
    """`model=` as the CLI's --model: a name or a path; an in-memory model object is refused (its repr
    is no path, and corp loads, perturbs and hashes the weights itself)."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    raise TypeError(
        f"model is a {type(model).__name__} object; pass a model name (an alias, a hub id) or a directory path, "
        "e.g. model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR), then model=DIR"
    )


def _backend_option(backend, options: dict):
    """A string is the CLI's --backend option (a model card's reproduce line passes it so; it used to
    reach the run as an engine object); an engine object is returned to be reused."""
    if isinstance(backend, str):
        options["backend"] = backend
        return None
    return backend


def _yaml_keys(config: str | None) -> set[str]:
    return {str(k).replace("-", "_") for k in read_yaml_config(config)} if config else set()


def _method_function(method: Method, label: str) -> Callable[..., Result]:
    name = method.name

    def method_fn(model=None, train_dataset=None, reward_funcs=None, **options) -> Result:
        return train(name, model, train_dataset, reward_funcs, **options)

    method_fn.__name__ = method_fn.__qualname__ = "train_" + method.made
    method_fn.__doc__ = (
        f"{label}: `corp.train('{name}', ...)` (see `corp.train`); options are `corp {name}`'s flags "
        f"(`corp.api.option_names('{name}')`). {method.help}"
    )
    return method_fn


# named by what each method makes (`Method.made`): `train_corp` runs `corp consolidate` (tests/test_method_names.py
# checks that each one's name is the name it is bound to here)
train_randopt = _method_function(randopt.METHOD, "RandOpt (top-K vote over scored specialists)")
train_corp = _method_function(consolidate.METHOD, "CoRP (one gated model from a population; `corp consolidate`)")
train_es = _method_function(es.METHOD, "ES (OpenES around a moving centre)")
train_grpo = _method_function(grpo.METHOD, "GRPO (TRL-style; loss grpo | cov | reco)")

__all__ = [
    "Result",
    "make_config",
    "option_names",
    "run",
    "task_for",
    "train",
    "train_corp",
    "train_es",
    "train_grpo",
    "train_randopt",
]
