"""Model cards: every model directory corp writes carries a README.md made with `huggingface_hub.ModelCard`.

The card says what the model is and how it was made, so the directory can be shared as people
share models: the base (for an embedded build, the build and not just the hub id it was quantized
from) with its weights hash, the method and its recipe, the labelled data the method used, the
run's test results with their paired intervals, the license the base imposes, and the exact
commands to load the model and to evaluate it with lm-evaluation-harness and with corp.

Two writers, one format: `run_model_card` (the run layer calls it when a run that saved
`RUN_DIR/model` completes; facts come from the run's report, recipe, config and splits) and
`apply_model_card` (`corp apply`: facts from the recipe and, when it is still there, the report of
the run that made it). The one line the one line `corp eval`/`corp apply` print for a model
directory that has none (`corp.models.card_note`: a plain Hugging Face directory is still used as it is).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from corp.models import CARD_FILE, embedded_spec
from corp.runs import naming
from corp.stats import comparison_line

# corp tasks with a counterpart of the same name in lm-evaluation-harness
LM_EVAL_TASKS = {"gsm8k": "gsm8k", "mbpp": "mbpp", "humaneval": "humaneval"}
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


def _results_lines(report: dict | None) -> list[str]:
    if not report:
        return ["No test results were recorded with this model."]
    lines = [
        f"Test split of `{report.get('task')}`, n = {report.get('n_test')} (held out: never used for a choice).",
        "",
        "| row | test accuracy | passes/example | labelled examples |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in report.get("rows") or []:
        lines.append(
            f"| {r.get('method')} | {r.get('accuracy', float('nan')):.3f} | {r.get('passes_per_example', 1)} | "
            f"{r.get('labelled_examples', 0)} |"
        )
    comps = report.get("comparisons") or []
    if comps:
        lines += ["", "Paired comparisons on the same test examples (bootstrap 95% interval, exact McNemar p):", ""]
        for c in comps:
            try:
                lines.append(f"- {comparison_line(c)}")
            except (KeyError, TypeError, ValueError):  # a report of an older layout: the pair without its numbers
                lines.append(f"- {c.get('a')} vs {c.get('b')}: see report.json")
    return lines


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
            f"- recreate the base: `{spec.install}`, then `corp models` (it converts once into `~/.cache/corp`)",
        ]
        return lines, spec.hf_id, spec.license
    mid = base.get("model_id") or base.get("model")
    lines = [f"- base: `{mid}`", f"- base weights sha256 (corp's hash over every tensor): `{h}`"]
    hub = mid if mid and not os.path.isabs(str(mid)) and "/" in str(mid) else None
    return lines, hub, None


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
    from huggingface_hub import ModelCard, ModelCardData

    base_lines, hub_base, license_id = _base_lines(base)
    data = ModelCardData(
        library_name="transformers",
        license=license_id or "other",
        base_model=hub_base,
        tags=["corp", method, "weight-space" if recipe else "post-trained"],
        pipeline_tag="text-generation",
    )
    path = str(model_dir.resolve())
    lm_task = LM_EVAL_TASKS.get((task or "").split(":")[0])
    lm_eval = (
        f"lm_eval --model hf --model_args pretrained={path},dtype=float32 --tasks {lm_task} --batch_size 8"
        if lm_task
        else f"lm_eval --model hf --model_args pretrained={path},dtype=float32 --tasks gsm8k --batch_size 8"
    )
    lm_note = (
        ""
        if lm_task
        else f"corp's task `{task}` has no lm-evaluation-harness counterpart; the line above evaluates the model on a "
        "standard task, and a custom task YAML over your own JSONL works the same way (`--include_path DIR`)."
    )
    recipe_lines = ["No recipe: this method's weights are not a seed combination (the weights here are the result)."]
    if recipe:
        comps = recipe.get("components") or recipe.get("direction", {}).get("components") or []
        where = recipe.get("_path", "recipe.json")
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
    label_lines = [f"- {k}: {v} labelled example(s)" for k, v in (labelled or {}).items()] or ["- not recorded"]
    cfg_lines = ["```yaml", *(f"{k}: {json.dumps(v, default=str)}" for k, v in sorted((config or {}).items())), "```"]
    license_text = LICENSES.get(
        license_id or "", "The base model's license applies; corp adds no terms (corp itself is Apache-2.0)."
    )
    body = "\n".join(
        [
            "---",
            data.to_yaml(),
            "---",
            "",
            f"# {title or model_dir.name}: `{method}` on `{task}`",
            "",
            *([f"**{notice}**", ""] if notice else []),
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
            f"- task: `{task}` (corp's fixed, disjoint splits; the seed is in the config below)",
            *label_lines,
            "(the `labelled examples` column below says how many each row's method used)",
            "",
            "## Results",
            "",
            *_results_lines(report),
            "",
            "## License",
            "",
            license_text,
            "",
            "## Load it",
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{path}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{path}")',
            "```",
            "",
            "## Evaluate it",
            "",
            "```bash",
            lm_eval,
            f"corp eval --model {path} --task {task or 'arith'}",
            "```",
            "",
            *([lm_note, ""] if lm_note else []),
            "## Configuration",
            "",
            *cfg_lines,
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
        tmp.write_text(text)
        os.replace(tmp, target)
    return target


def run_model_card(
    run_dir: Path, method: str, cfg: dict, model_id: str | None, weights_hash: str | None, splits: dict | None
) -> Path | None:
    """The card of `RUN_DIR/model`, from what the run recorded; None when the run saved no model."""
    from corp.models import MARKER

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
        made_by=f"run directory `{run_dir.resolve()}`",
        title=run_dir.name,
    )
    return write_card(model_dir, text)


# the report's method of a run whose recipe names another (`made_by.method`)
_REPORT_METHOD = {"corp": "consolidate"}
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
        if same and (method is None or report.get("method") in (None, method, _REPORT_METHOD.get(method))):
            return d
    return None


def apply_model_card(out: Path, recipe_path: Path, recipe: dict, base_name: str, mismatch: dict | None = None) -> Path:
    """The card of a model `corp apply` rebuilt: the recipe's facts and, if its run is still there
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
        made_by=f"`corp apply {recipe_path.resolve()}`",
        notice=notice,
    )
    return write_card(out, text)
