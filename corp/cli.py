"""The `corp` command line: parse, build a config, call the library. Nothing else lives here.

Each run command's options are generated from its config dataclass (field docstrings are the help),
so the CLI, YAML configs and the library share one set of names.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing
import warnings
from typing import Callable, Optional

import typer

from corp import CorpError
from corp.analysis.config import AnalyzeRankConfig
from corp.baselines.es import ESConfig
from corp.baselines.grpo.core import GRPOConfig
from corp.config import PopulationConfig, RandOptConfig, field_docs, load_config
from corp.consolidate.corp_operator import ConsolidateConfig
from corp.evaluate.passk import EvalConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Post-train language models in weight space without gradients.")


def _one_line_warnings() -> None:
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"warning: {message}", file=sys.stderr)

    warnings.showwarning = show


def _run(fn: Callable, *args):
    _one_line_warnings()
    try:
        return fn(*args)
    except CorpError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    except KeyboardInterrupt:
        cfg = args[0] if args else None
        where = getattr(cfg, "run_dir", None)
        typer.echo("\ninterrupted: every specialist already scored is saved; rerun with the same --run-dir to resume" + (f" ({where})" if where else ""), err=True)
        raise typer.Exit(130)


def _cli_type(tp) -> type:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    base = tp
    if typing.get_origin(base) is list:
        return str  # comma-separated on the command line
    return base


def config_command(name: str, cls: type, help_text: str):
    """Register `corp NAME` whose options are the fields of config dataclass `cls`."""

    def decorator(runner: Callable[[object], None]):
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        params = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            shown = ",".join(map(str, default)) if isinstance(default, list) else default
            help_ = docs.get(f.name, "") + (f" [default: {shown}]" if shown not in (None, "") else "")
            opt = typer.Option(None, "--" + f.name.replace("_", "-"), help=help_, show_default=False)
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=Optional[_cli_type(hints[f.name])]))
        params.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=typer.Option(None, "--config", help="YAML file of options (flags override it)."), annotation=Optional[str]))

        def command(**kwargs):
            yaml_path = kwargs.pop("config")
            _run(lambda: runner(load_config(cls, yaml_path, kwargs)))

        command.__signature__ = inspect.Signature(params)
        command.__doc__ = help_text
        command.__name__ = name.replace("-", "_")
        app.command(name, help=help_text)(command)
        return runner

    return decorator


@config_command("randopt", RandOptConfig, "RandOpt: score N perturbed specialists, report base, top-1 and top-K vote on the test split.")
def randopt_cmd(cfg: RandOptConfig) -> None:
    from corp.baselines.randopt import run_randopt

    report = run_randopt(cfg)
    typer.echo(report["table"])
    typer.echo(f"run directory: {report['run_dir']}")


@config_command("score", PopulationConfig, "Score a population of perturbed specialists on the support split (population.jsonl).")
def score_cmd(cfg: PopulationConfig) -> None:
    from corp.evaluate.scorer import ensure_population, setup_run

    ctx = setup_run(cfg, "score", needs=("support",))
    ranked = ensure_population(ctx)
    rewards = sorted(r["reward"] for r in ranked)
    typer.echo(f"{len(ranked)} specialists; support reward best {rewards[-1]:.3f}, median {rewards[len(rewards) // 2]:.3f}, worst {rewards[0]:.3f}")
    typer.echo(f"run directory: {ctx.run_dir}")


@config_command("consolidate", ConsolidateConfig, "CoRP: consolidate a rewarded population into one gated model (recipe.json + model/).")
def consolidate_cmd(cfg: ConsolidateConfig) -> None:
    from corp.consolidate.run import run_consolidate

    report = run_consolidate(cfg)
    typer.echo(report["table"])
    typer.echo(f"run directory: {report['run_dir']}  (recipe.json, model/, report.json)")


@app.command("apply")
def apply_cmd(
    recipe: str = typer.Argument(..., help="recipe.json written by `corp consolidate`."),
    out: str = typer.Option(..., "--out", help="Directory to write the rebuilt Hugging Face model to."),
    model: Optional[str] = typer.Option(None, "--model", help="Base model to apply it to (default: the recipe's); must have the recipe's weights."),
) -> None:
    """Rebuild a consolidated model from its recipe and the base model, bit-exactly."""
    from corp.consolidate.recipe import apply_recipe

    path = _run(apply_recipe, recipe, out, model)
    typer.echo(f"wrote {path}")


@config_command("es", ESConfig, "ES: iterative OpenES around a moving centre; saves the model and its seed recipe, reports test accuracy.")
def es_cmd(cfg: ESConfig) -> None:
    from corp.baselines.es import run_es

    r = run_es(cfg)
    for m in r["metrics"]:
        typer.echo(f"iteration {m['iteration']}: population reward {m['reward_mean']:.3f} (max {m['reward_max']:.3f}), centre {m.get('centre_reward', float('nan')):.3f}")
    typer.echo(f"test accuracy: base {r['test_accuracy_before']:.3f} -> es {r['test_accuracy_after']:.3f}  ({r['training_ledger']['flops']:.3e} FLOPs)")
    typer.echo(f"run directory: {r['run_dir']}")


@config_command("grpo", GRPOConfig, "GRPO (TRL-style) with loss variants grpo | cov | reco; full-parameter or LoRA; saves an HF model directory.")
def grpo_cmd(cfg: GRPOConfig) -> None:
    from corp.baselines.grpo.core import run_grpo

    r = run_grpo(cfg)
    if r["test_accuracy_before"] is not None:
        typer.echo(f"test accuracy: base {r['test_accuracy_before']:.3f} -> grpo-{cfg.loss} {r['test_accuracy_after']:.3f}")
    led = r["training_ledger"]
    typer.echo(f"{r['steps']} steps; trained tokens {led['trained_tokens']}, inference tokens {led['prompt_tokens'] + led['generated_tokens']}, {led['flops']:.3e} FLOPs")
    typer.echo(f"model: {r['model_dir']}")


@config_command("eval", EvalConfig, "Evaluate a model on the test split: greedy accuracy and pass@k with n samples per problem.")
def eval_cmd(cfg: EvalConfig) -> None:
    from corp.evaluate.passk import run_eval

    typer.echo(run_eval(cfg)["table"])


@config_command("analyze-rank", AnalyzeRankConfig, "Split-half low-rank analysis of a scored population (--run DIR, or --model/--task/--population to score first): reproducible rank r* per weight matrix.")
def analyze_rank_cmd(cfg: AnalyzeRankConfig) -> None:
    from corp.analysis.split_half import run_analyze_rank

    summary = run_analyze_rank(cfg)
    typer.echo(summary["text"])
    typer.echo(f"wrote rank_analysis.csv, rank_summary.json, rank_overlap.png, rank_heatmap.png in {summary['run_dir']}")


@app.command("models")
def models_cmd() -> None:
    """List model aliases and what is available on this machine."""
    from corp.models import list_models

    for row in list_models():
        typer.echo(f"{row['alias']:<14} {row['model']:<38} {row['status']}")


@app.command("tasks")
def tasks_cmd() -> None:
    """List tasks and their options."""
    from corp.evaluate.tasks import list_tasks

    for row in list_tasks():
        typer.echo(f"{row['task']:<12} {row['description']}")


if __name__ == "__main__":
    app()
