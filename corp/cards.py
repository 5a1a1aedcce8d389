"""Model cards: every model directory corp writes carries a README.md made with `huggingface_hub.ModelCard`.

The card says what the model is and how it was made, so the directory can be shared as people
share models: first what the weights are (consolidated, trained, or the base unchanged because the
gate abstained) and which result row is theirs, then the base (for an embedded build, the build and
not just the hub id it was quantized from) with its weights hash, the method and its recipe, the
labelled data the method used, the run's test results with their paired intervals, the license the
base imposes, and the commands to load the model, to evaluate it with lm-evaluation-harness (where
the task has a counterpart there) and to reproduce its row with `corp eval`. Paths are relative to
the model directory: a card names no absolute path of the machine that made it.

Two writers, one format: `run_model_card` (the run layer calls it when a run that saved
`RUN_DIR/model` completes; facts come from the run's report, recipe, config and splits) and
`apply_model_card` (`corp apply`: facts from the recipe and, when it is still there, the report of
the run that made it). The one line the one line `corp eval`/`corp apply` print for a model
directory that has none (`corp.runtime.models.card_note`: a plain Hugging Face directory is still used as it is).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from corp.algorithms.corp_operator.gate import kept_out_line, margin_line
from corp.algorithms.stats import comparison_line
from corp.config import RunConfig, flag, option_names
from corp.grids import edge_lines
from corp.runtime.models import CARD_FILE, MARKER, embedded_spec, shown_datasets
from corp.runtime.runs import naming

# corp tasks with a counterpart in lm-evaluation-harness (its own prompts and full test sets, so its
# numbers are not the card's); the code tasks need its --confirm_run_unsafe_code
LM_EVAL_TASKS = {"gsm8k": "gsm8k", "math500": "minerva_math500", "mbpp": "mbpp", "humaneval": "humaneval"}
CODE_TASKS = ("mbpp", "humaneval")
DATA_TASKS = ("gsm8k", "math500", "mbpp", "humaneval")  # read files from --data DIR / $CORP_DATA_DIR
EVAL_DEFAULTS = {"batch_size": 64}  # corp eval's defaults the reproduce line leaves out
LICENSES = {
    "apache-2.0": "Apache-2.0 (the base model's license)",
    "gemma": "Gemma Terms of Use (https://ai.google.dev/gemma/terms): they apply to this derivative of Gemma",
}


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _results_lines(report: dict | None, task: str | None) -> list[str]:
    if not report:
        return ["No test results were recorded with this model."]
    by_reward = report.get("measure") == "reward"  # no gold answers: the reward, and the prompts it scored
    lines = [
        f"Test split of `{task}`, n = {report.get('n_test')} (held out: never used for a choice).",
        *(["The data has no gold answers: each row is its mean test reward."] if by_reward else []),
        "",
        "| row | test reward | passes/example | labelled examples | prompts scored |"
        if by_reward
        else "| row | test accuracy | passes/example | labelled examples |",
        "| --- | ---: | ---: | ---: |" + (" ---: |" if by_reward else ""),
    ]
    for r in report.get("rows") or []:
        value = r.get("reward" if by_reward else "accuracy")
        lines.append(
            f"| {r.get('method')} | {float('nan') if value is None else value:.3f} | {r.get('passes_per_example', 1)} | "
            f"{r.get('labelled_examples', 0)} |" + (f" {r.get('scored_prompts', 0)} |" if by_reward else "")
        )
    comps = report.get("comparisons") or []
    if comps:
        how = "bootstrap 95% interval" + ("" if by_reward else ", exact McNemar p")
        lines += ["", f"Paired comparisons on the same test examples ({how}):", ""]
        for c in comps:
            try:
                lines.append(f"- {comparison_line(c)}")
            except (KeyError, TypeError, ValueError):  # a report of an older layout: the pair without its numbers
                lines.append(f"- {c.get('a')} vs {c.get('b')}: see report.json")
    return lines


def _portable(value: Any, model_dir: Path) -> Any:
    """A value for the card with no absolute path of the machine that made it: a path beside or
    under the model directory's parent becomes relative to the model directory, any other absolute
    path `.../NAME`; `jsonl:/abs/file`-style task specs keep their prefix; a dataset the Python API
    stored in corp's cache is its name, `dataset-<hash>`."""
    if isinstance(value, list):
        return [_portable(v, model_dir) for v in value]
    if not isinstance(value, str):
        return value
    value = shown_datasets(value)
    prefix, _, rest = value.partition(":")
    if rest and not os.path.isabs(value) and os.path.isabs(rest):
        return f"{prefix}:{_portable(rest, model_dir)}"
    if not os.path.isabs(value):
        return value
    path, home = Path(value).resolve(), model_dir.resolve()
    if path == home or home.parent in path.parents or path == home.parent:
        return os.path.relpath(path, home)
    return f".../{path.name}"


def _model_row(report: dict | None) -> dict | None:
    """The report row of the saved model: every method that saves RUN_DIR/model reports it last."""
    rows = (report or {}).get("rows") or []
    return rows[-1] if rows and rows[-1].get("method") != "base" else None


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _gate_lines(made: dict, report: dict | None) -> list[str]:
    """The gate's margin (wins and losses of n, the paired mean difference, its bound and z, what it decided)
    and, when it kept the base, what the candidate it kept out scored on test beside the base (issue 55)."""
    lines = []
    if isinstance(made.get("gate"), dict) and "wins" in made["gate"]:
        lines += ["", f"{_sentence(margin_line(made['gate']))}."]
    # the report's section of the method that made the recipe is named as its made_by.method (CoRP's "corp")
    cand = ((report or {}).get(made.get("method")) or {}).get("candidate_test")
    if cand and not cand.get("deployed"):
        lines += ["", f"{_sentence(kept_out_line(cand))}."]
    return lines


def _edge_lines(report: dict | None) -> list[str]:
    """How the population's noise scales were chosen (calibrated from the model, or fixed by --sigmas:
    report.json's `population.noise_scales`; ES's one scale, calibrated or fixed by --sigma: its top-level
    `noise_scales`), then searched values that landed on the edge of their grid (report.json's `edge_flags`,
    corp.grids)."""
    noise = ((report or {}).get("population") or {}).get("noise_scales") or (report or {}).get("noise_scales")
    lines = edge_lines((report or {}).get("edge_flags"))
    return [
        *(["", f"{_sentence(noise)}."] if noise else []),
        *(["", "Searched values on the edge of their grid:", *(f"- {line}." for line in lines)] if lines else []),
    ]


def _weights_lines(method: str, recipe: dict | None, report: dict | None) -> list[str]:
    """The card's first lines: what these weights are, and which result row is theirs."""
    made = (recipe or {}).get("made_by") or {}
    if "accepted" in made and not made["accepted"]:
        what = (
            f"**These are the base model's weights, unchanged**: `{method}`'s gate abstained (no candidate's gain "
            "on the validation split cleared its lower confidence bound), so the run returned the base."
        )
    elif "accepted" in made:
        what = (
            f"**These weights are the base consolidated by `{method}`**: the base plus the merged direction of "
            f"candidate `{made.get('candidate')}`, which passed the validation gate."
        )
    elif "iterations" in made:  # an ES centre: the one recipe made after a number of iterations
        what = (
            f"**These weights are the ES centre after {made.get('iterations')} iteration(s)**: the base plus the "
            "seed combination the recipe records."
        )
    else:
        steps = (report or {}).get("steps")
        what = f"**These weights are the base trained by `{method}`**" + (f" for {steps} step(s)." if steps else ".")
    lines = [what]
    if made.get("reason"):
        lines += ["", f"Gate: {made['reason']}."]
    lines += _gate_lines(made, report)
    row = _model_row(report)
    if row is not None:
        what = "reward" if (report or {}).get("measure") == "reward" else "accuracy"
        value = row.get(what)
        lines += [
            "",
            f"Their test {what} is row `{row.get('method')}` of the results below: "
            f'{float("nan") if value is None else value:.3f} ("Evaluate it" below reproduces it).',
        ]
    return lines


def _eval_options(config: dict | None, model_dir: Path) -> list[tuple[str, Any]]:
    """(config field, value) of what fixes the card's test numbers beside the task: the test split (size
    and split seed; the other sizes too when the rows were reported on validation), the generation
    length, reward, batch size, dtype, backend and device."""
    cfg = config or {}
    out: list[tuple[str, Any]] = []
    # the test split is drawn first (its examples do not depend on the other sizes), but the run's
    # sizes must fit the data as they did: `corp eval`'s defaults may not fit a small dataset
    sizes = [(k, cfg[k]) for k in ("n_support", "n_probe", "n_validation") if cfg.get(k) is not None]
    validation = cfg.get("report_on") == "validation"
    if validation:
        out += [*sizes, ("report_on", "validation")]
    for key in ("n_test", "split_seed", "max_new_tokens", "reward", "batch_size", "dtype", "device"):
        if cfg.get(key) is not None and cfg.get(key) != EVAL_DEFAULTS.get(key):
            out.append((key, _portable(cfg[key], model_dir)))
    if not validation:
        out += sizes
    if cfg.get("backend"):  # a run that saves a model scores it in-process: on hf, whatever auto would pick now
        out.append(("backend", "hf" if cfg["backend"] == "auto" else cfg["backend"]))
    return out


def _eval_command(task: str | None, config: dict | None, model_dir: Path) -> str:
    """`corp eval` on this directory with the task (its prompt options are in the spec) and `_eval_options`."""
    parts = ["corp eval --model .", f"--task {shlex.quote(str(_portable(task or 'arith', model_dir)))}"]
    parts += [f"{flag(k, RunConfig)} {shlex.quote(str(v))}" for k, v in _eval_options(config, model_dir)]
    return " ".join(parts)


def _api_eval_lines(task: str | None, config: dict | None, model_dir: Path) -> list[str] | None:
    """For a run made with the Python API (a dataset object, stored as `dataset-<hash>`, or a Python reward
    function, which `corp eval` cannot name): `corp.train("eval", ...)` with `DATASET` and `REWARD` to
    supply; None for any other run (its `corp eval` line reproduces it)."""
    shown = str(_portable(task or "arith", model_dir))
    reward = str((config or {}).get("reward") or "")
    from_api = shown.startswith("jsonl:dataset-")
    python_reward = reward.startswith("python:")
    if not (from_api or python_reward):
        return None
    names = option_names(RunConfig)
    args = ['"eval"', '"."', "DATASET" if from_api else "None", "REWARD" if python_reward else "None"]
    if from_api and ":test=dataset-" in shown:
        args.append("eval_dataset=EVAL_DATASET")
    if not from_api:
        args.append(f"task={shown!r}")
    args += [
        f"{names.get(k, k)}={v!r}" for k, v in _eval_options(config, model_dir) if not (k == "reward" and python_reward)
    ]
    supply = []
    if from_api:
        name = shown.split(":")[1]  # dataset-<a sha256 prefix of the JSONL corp stored the rows as>
        supply.append(
            "`DATASET` (the rows the run was given, as a list of dicts or a `datasets.Dataset`, with the same "
            f"prompt_column and answer_column; `{name}` names them by content)"
        )
        if ":test=dataset-" in shown:
            supply.append("`EVAL_DATASET` (its eval_dataset)")
    if python_reward:
        fn = reward[len("python:") :].split("@")[0].replace("+", "`, `")
        supply.append(f"`REWARD` (its reward function(s) `{fn}`, with its reward_weights if it had some)")
    return [
        "```python",
        "import corp  # in this directory",
        "",
        f"corp.train({', '.join(args)})",
        "```",
        "",
        f"The run was made with corp's Python API, from objects no `corp eval` line can name: supply "
        f"{' and '.join(supply)}; the same rows give the same test examples on any machine.",
        "",
    ]


def _base_lines(base: dict) -> tuple[list[str], str | None, str | None]:
    """(card lines, hub base id for the metadata, license id) for the base model."""
    spec = embedded_spec(base.get("model_id")) or embedded_spec(base.get("model"))
    h = base.get("weights_hash") or "not recorded by this run"
    if spec is not None:
        lines = [
            (
                f"- base: `{base.get('model')}`, {spec.build}; its weights are the quantized ones "
                "converted to float32, "
                f"not the hub's `{spec.hf_id}` weights, so accuracies are not comparable with published numbers for it"
            ),
            f"- base weights sha256 (corp's hash over every tensor): `{h}`",
            (
                f"- recreate the base: `{spec.install}`; the first command that uses it converts it once into "
                "`~/.cache/corp` (`corp models` lists it)"
            ),
        ]
        return lines, spec.hf_id, spec.license
    mid = base.get("model_id") or base.get("model")
    local = mid is not None and os.path.isabs(str(mid))
    shown = (
        f"a local directory named `{Path(str(mid)).name}` (its weights hash below identifies it)"
        if local
        else f"`{mid}`"
    )
    lines = [f"- base: {shown}", f"- base weights sha256 (corp's hash over every tensor): `{h}`"]
    hub = mid if mid and not local and "/" in str(mid) else None
    return lines, hub, None


def _evaluate_lines(task: str | None, config: dict | None, model_dir: Path) -> list[str]:
    """The card's "Evaluate it": lm-evaluation-harness where the task has a counterpart, and `corp eval`
    (for a Python API run, `corp.train("eval", ...)`: `_api_eval_lines`)."""
    api = _api_eval_lines(task, config, model_dir)
    if api is not None:
        return api
    name = (task or "").split(":")[0]
    lm_task = LM_EVAL_TASKS.get(name)
    evaluate = ["```bash", "# in this directory"]
    if lm_task:
        evaluate.append(
            f"lm_eval --model hf --model_args pretrained=.,dtype=float32 --tasks {lm_task} --batch_size 8"
            + (" --confirm_run_unsafe_code" if name in CODE_TASKS else "")
        )
    evaluate += [_eval_command(task, config, model_dir), "```", ""]
    if lm_task:
        evaluate += [
            f"lm-evaluation-harness's `{lm_task}` uses its own prompt and the whole test set, so its number is not "
            "the card's; `corp eval` reproduces the card's row (the same test examples, prompt and generation length).",
            "",
        ]
    else:
        evaluate += [
            f"corp's task `{_portable(task, model_dir)}` has no lm-evaluation-harness counterpart; `corp eval` reproduces the card's row "
            "(the same test examples, prompt and generation length).",
            "",
        ]
    if name in DATA_TASKS:
        evaluate += [f"`{name}` reads its data files from `--data DIR` or `$CORP_DATA_DIR`, as the run did.", ""]
    return evaluate


def _recipe_lines(recipe: dict | None, model_dir: Path, notice: str | None) -> list[str]:
    """The recipe's kind, noise scheme, filter and seed count, and how to rebuild the weights from it."""
    recipe_lines = ["No recipe: this method's weights are not a seed combination (the weights here are the result)."]
    if recipe:
        comps = recipe.get("components") or recipe.get("direction", {}).get("components") or []
        where = _portable(recipe.get("_path", "recipe.json"), model_dir)
        recipe_lines = [
            (
                f"- recipe kind `{recipe.get('kind')}`, noise scheme `{recipe.get('noise_scheme')}`, "
                f"parameter filter `{json.dumps(recipe.get('param_filter'))}`, {seed_count(comps)} seed component(s)"
            ),
            (
                f"- the recipe `{where}` (kilobytes) rebuilds these weights bit for bit from the base: "
                f"`corp apply {where} --out DIR`"
                if not notice
                else f"- the recipe `{where}` was edited after its run; these weights are what it gives now"
            ),
        ]
    return recipe_lines


LOAD_LINES = [
    "## Load it",
    "",
    "```python",
    "from transformers import AutoModelForCausalLM, AutoTokenizer",
    "",
    'path = "."  # this directory',
    "model = AutoModelForCausalLM.from_pretrained(path)",
    "tokenizer = AutoTokenizer.from_pretrained(path)",
    "```",
    "",
]


def _metadata(method: str, recipe: dict | None, hub_base: str | None, license_id: str | None) -> str:
    """The card's YAML header, as the Hub reads it (library, license, base model, tags)."""
    from huggingface_hub import ModelCardData

    return ModelCardData(
        library_name="transformers",
        license=license_id or "other",
        base_model=hub_base,
        tags=["corp", method, "weight-space" if recipe else "post-trained"],
        pipeline_tag="text-generation",
    ).to_yaml()


def _config_lines(config: dict | None, model_dir: Path) -> list[str]:
    """The run's configuration as a YAML block, paths made relative to the model where they can be."""
    return [
        "```yaml",
        *(f"{k}: {json.dumps(_portable(v, model_dir), default=str)}" for k, v in sorted((config or {}).items())),
        "```",
    ]


def _label_lines(report: dict | None, labelled: dict | None) -> list[str]:
    """The card's count of each split; with no gold answers the splits are prompts the reward scored,
    not labelled examples."""
    kind = (
        "prompt(s) scored by the reward, 0 labelled"
        if (report or {}).get("measure") == "reward"
        else "labelled example(s)"
    )
    return [f"- {k}: {v} {kind}" for k, v in (labelled or {}).items()] or ["- not recorded"]


def build_card(
    model_dir: Path,
    *,
    method: str,
    base: dict,
    task: str | None,
    recipe: dict | None,
    report: dict | None,
    labelled: dict | None,
    config: dict | None,
    made_by: str,
    title: str | None = None,
    notice: str | None = None,
) -> str:
    from huggingface_hub import ModelCard

    base_lines, hub_base, license_id = _base_lines(base)
    evaluate = _evaluate_lines(task, config, model_dir)
    shown = _portable(task, model_dir)  # no path of the machine: the heading, the data and results lines
    recipe_lines = _recipe_lines(recipe, model_dir, notice)
    label_lines = _label_lines(report, labelled)
    license_text = LICENSES.get(
        license_id or "", "The base model's license applies; corp adds no terms (corp itself is Apache-2.0)."
    )
    body = "\n".join(
        [
            "---",
            _metadata(method, recipe, hub_base, license_id),
            "---",
            "",
            f"# {title or model_dir.name}: `{method}` on `{shown}`",
            "",
            *([f"**{notice}**", ""] if notice else []),
            *_weights_lines(method, recipe, report),
            *_edge_lines(report),
            "",
            (
                f"Made by corp ({made_by}), a toolkit that post-trains language models in weight space. "
                "This directory is a plain Hugging Face model: transformers loads it with nothing else."
            ),
            "",
            "## Base model",
            "",
            *base_lines,
            "",
            "## Method and recipe",
            "",
            f"- method: `{method}`",
            *recipe_lines,
            "",
            "## Labelled data used",
            "",
            f"- task: `{shown}` (corp's fixed, disjoint splits; the seed is in the config below)",
            *label_lines,
            "(the `labelled examples` column below says how many each row's method used)",
            "",
            "## Results",
            "",
            *_results_lines(report, shown),
            "",
            "## License",
            "",
            license_text,
            "",
            *LOAD_LINES,
            "## Evaluate it",
            "",
            *evaluate,
            "## Configuration",
            "",
            *_config_lines(config, model_dir),
            "",
        ]
    )
    return ModelCard(body).content


def seed_count(components: list) -> int:
    """Seeds in a recipe's components: a merged term (CoRP's deployed direction) counts each of its seeds."""
    return sum(len(c["merged"]) if isinstance(c, dict) and isinstance(c.get("merged"), list) else 1 for c in components)


def write_card(model_dir: Path, text: str) -> Path:
    """Write the card atomically into a model directory corp wrote."""
    target = model_dir / CARD_FILE
    tmp = model_dir / f".{CARD_FILE}.tmp"
    with naming(target):  # a full disk names the card
        try:
            tmp.write_text(text)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)  # a card that could not be written leaves no half of it behind
    return target


def run_model_card(
    run_dir: Path, method: str, cfg: dict, model_id: str | None, weights_hash: str | None, splits: dict | None
) -> Path | None:
    """The card of `RUN_DIR/model`, from what the run recorded; None when the run saved no model."""

    model_dir = run_dir / "model"
    if not (model_dir / MARKER).is_file():
        return None
    report = _read(run_dir / "report.json")
    recipe = _read(run_dir / "recipe.json")
    if isinstance(recipe, dict):
        recipe["_path"] = str((run_dir / "recipe.json").resolve())
        weights_hash = recipe.get("base_weights_hash") or weights_hash
    # the labelled splits (their halves, e.g. support_select, are parts of these); each result row
    # below says how many of them its method used
    labelled = {
        name: len(ex) for name, ex in (splits or {}).items() if name in ("support", "probe", "validation") and ex
    }
    text = build_card(
        model_dir,
        method=method,
        base={"model": cfg.get("model"), "model_id": model_id, "weights_hash": weights_hash},
        task=cfg.get("task"),
        recipe=recipe if isinstance(recipe, dict) else None,
        report=report if isinstance(report, dict) else None,
        labelled=labelled,
        config=cfg,
        made_by=f"run directory `{run_dir.name}`, which holds this directory",
        title=run_dir.name,
    )
    return write_card(model_dir, text)


# what makes two recipes the same model (a copy of a run's recipe.json keeps all of them)
_RECIPE_IDENTITY = ("base_weights_hash", "noise_scheme", "components", "low_rank", "model_weights_hash", "made_by")


def recipe_run(recipe_path: Path, recipe: dict) -> Path | None:
    """The run directory that made the recipe, if still there: beside it (a copied run directory) or
    where it was made, only when that directory's own recipe.json is this recipe and its report is
    of the recipe's method (an ES recipe copied into a CoRP run directory must not take its rows)."""
    made = recipe.get("made_by") if isinstance(recipe.get("made_by"), dict) else {}
    method = made.get("method")
    for d in [recipe_path.parent] + ([Path(made["run_dir"])] if made.get("run_dir") else []):
        own, report = _read(d / "recipe.json"), _read(d / "report.json")
        if not (isinstance(own, dict) and isinstance(report, dict)):
            continue
        same = all(own.get(k) == recipe.get(k) for k in _RECIPE_IDENTITY)
        if same and (method is None or _made_here(method, report)):
            return d
    return None


def _made_here(method: str, report: dict) -> bool:
    """Whether a run's report is of the method its recipe's made_by.method names: the report's own
    method, or one of its rows (CoRP's report, of `corp consolidate`, has the row `corp`: Method.made);
    a report that names no method is taken as it."""
    rows = {str(r.get("method", "")).split(" ")[0] for r in report.get("rows") or [] if isinstance(r, dict)}
    return report.get("method") in (None, method) or method in rows


def apply_model_card(out: Path, recipe_path: Path, recipe: dict, base_name: str, mismatch: dict | None = None) -> Path:
    """Write `apply_card_text` into the model directory `out`."""
    return write_card(out, apply_card_text(out, recipe_path, recipe, base_name, mismatch))


def apply_card_text(out: Path, recipe_path: Path, recipe: dict, base_name: str, mismatch: dict | None = None) -> str:
    """The card of a model `corp apply` rebuilds into `out` (made before the model is saved: it is
    written with it, before the marker, so no marked model lacks its card): the recipe's facts and, if its run is still there
    (`recipe_run`), that run's report. With `mismatch` (`--allow-mismatch`: the rebuilt weights are
    not the ones the run evaluated) the card says so first and takes nothing from the run."""
    made = recipe.get("made_by") or {}
    run_dir = None if mismatch else recipe_run(recipe_path, recipe)
    report = _read(run_dir / "report.json") if run_dir else None
    cfg = _read_yaml(run_dir / "config.yaml") if run_dir else {}
    recipe = {**recipe, "_path": str(recipe_path.resolve())}
    task = (report.get("task") if isinstance(report, dict) else None) or cfg.get("task")
    splits = (_read(run_dir / "splits.json") if run_dir else None) or {}
    labelled = {
        k: len(v) for k, v in splits.items() if k in ("support", "probe", "validation") and isinstance(v, list) and v
    }
    notice = (
        f"These weights (sha256 {mismatch['rebuilt'][:12]}...) are not the model the recipe's run evaluated "
        f"({mismatch['evaluated'][:12]}...): the recipe was edited and applied with --allow-mismatch, so nothing "
        "here has been evaluated."
        if mismatch
        else None
    )
    text = build_card(
        out,
        method=str(made.get("method", recipe.get("kind"))),
        base={
            "model": recipe.get("base_model", base_name),
            "model_id": recipe.get("base_model_id"),
            "weights_hash": recipe.get("base_weights_hash"),
        },
        task=task,
        recipe=recipe,
        report=report if isinstance(report, dict) else None,
        labelled=labelled,
        config=cfg if isinstance(cfg, dict) else None,
        made_by=f"`corp apply {_portable(str(recipe_path.resolve()), out)}`",
        notice=notice,
    )
    return text
