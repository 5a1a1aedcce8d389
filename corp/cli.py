"""The `corp` command line: parse, build a config, call the library. Nothing else lives here.

One command per registered method (`corp.methods.METHODS`): tyro generates its options from the
method's config dataclass (field docstrings are the help; docs/commands.md says why tyro), so the CLI,
YAML configs and the library share one set of names. Renamed options keep their old flag as a hidden,
deprecated alias.
`apply`, `models` and `tasks` are plain commands. Bad input of any kind is one `error:` line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib.metadata
import io
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer
import tyro
from typer.core import TyperGroup

from corp.algorithms.recipe import apply_recipe
from corp.api import run as run_config
from corp.bench.report import readme_section as section
from corp.bench.report import write_into
from corp.bench.sweep import load_bench_config, run_bench
from corp.config import field_docs, flag, load_config, option_names, renamed_options, to_fields
from corp.config_types import comma_list
from corp.errors import CorpError, NotEnoughMemory
from corp.evaluate.tasks import list_tasks
from corp.methods import Method, methods
from corp.runtime.models import list_models, resolve_model
from corp.runtime.runs import write_failure
from corp.tracking import check_report_to, export_bench_results


class _OneLineErrors(TyperGroup):
    """Usage errors (unknown option, bad value, missing argument) as one `error:` line, no usage box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        args = sys.argv[1:] if args is None else list(args)
        if not args:  # bare `corp`: the help, as `corp --help` prints it
            args = ["--help"]
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        except Exception as exc:
            # click's (or typer's vendored click's) exceptions: a message and an exit code
            if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
                raise
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None and exc.exit_code == 2 else ""
            typer.echo(f"error: {' '.join(exc.format_message().split())}{hint}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def format_commands(self, ctx, formatter) -> None:
        """Each command with its summary whole, wrapped (click cuts it at the terminal's width with '...'):
        the first paragraph of its help."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, " ".join((cmd.short_help or cmd.help or "").split("\n\n")[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    pretty_exceptions_enable=False,
    # help text as written: rich markup would read `[default: 64]` and `sigmas[i % len(sigmas)]` as tags and drop them
    rich_markup_mode=None,
    help="Post-train language models in weight space without gradients.",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"corp {importlib.metadata.version('corp')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print corp's version and exit."),
    ] = False,
) -> None:
    pass


def _one_line_warnings() -> None:
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"warning: {message}", file=sys.stderr)

    warnings.showwarning = show


# Ctrl-C: what is kept, per kind of command (a method's run directory: `_run_kept`; apply's old model; a bench's cells)
INTERRUPTED = {
    "apply": "--out holds the earlier model or the new one, never part of one (a model is written beside it and "
    "renamed into place); run the same command again",
    "bench": "every finished cell is saved; rerun the same command to go on",
    "prepare": "the model was not converted (a half-written GGUF or directory is never used); run it again",
}


def _run(fn: Callable, *args, interrupted: str = "run"):
    _one_line_warnings()
    try:
        return fn(*args)
    except CorpError as exc:
        typer.echo(f"error: {exc}", err=True)
        # too little memory now is the machine's state, not bad input: 75 (EX_TEMPFAIL) says a retry may fit
        raise typer.Exit(75 if isinstance(exc, NotEnoughMemory) else 2) from None
    except Exception as exc:
        # the machine's state, not a bug: a full disk or quota, a read-only place (from any library:
        # corp.runtime.runs.write_failure), a name too long
        too_long = isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG
        why = exc.strerror if too_long else write_failure(exc)
        if why is None:
            raise
        name = getattr(exc, "filename", None)
        where = f" ('{name}')" if name else ""
        typer.echo(
            f"error: {why}{where}; free some space or choose another location, then {_again(interrupted, exc)}",
            err=True,
        )
        raise typer.Exit(2) from None
    except KeyboardInterrupt as exc:
        said = _run_kept(exc, args[0] if args else None) if interrupted == "run" else INTERRUPTED[interrupted]
        typer.echo(f"\ninterrupted: {said}", err=True)
        raise typer.Exit(130) from None


def _run_kept(exc: BaseException, cfg) -> str:
    """What an interrupted method run kept, as it is: its run directory (`corp_run_dir`, noted by the
    run layer; runs/NAME when no --output-dir was given) only when something was saved there."""
    where, given = getattr(exc, "corp_run_dir", None), getattr(cfg, "run_dir", None)
    if where is not None and getattr(exc, "corp_saved", False):
        return (
            f"what the run finished (every evaluation, the last checkpoint) is saved in '{where}'; "
            f"rerun with --output-dir {where} to resume"
        )
    return "this command saved nothing" + (f" in --output-dir '{given}'" if given else "") + "; run it again"


def _again(kind: str, exc: BaseException) -> str:
    """After a full disk: how to go on, for this kind of command (apply takes --out, not --output-dir)."""
    where = getattr(exc, "corp_run_dir", None)
    if kind == "run":
        return f"rerun with --output-dir {where} (it resumes)" if where else "rerun the same command"
    if kind == "apply":
        return "run the same command again with the same --out"
    return "rerun the same command"


# The method commands' options come from tyro (the library cleanrl builds its CLI with), reading a dataclass
# generated from the config: one optional field per option, so a flag not given stays None and only the flags
# given override `--config` and the defaults (corp.config.load_config). What corp adds on top of tyro: a list
# field is one comma-separated word (`--top-k 1,4,16`, `--sigmas auto`) handed as text to corp.config.check_types,
# which reads it as it reads a YAML value (one comma-list parser); a renamed option's old flag (hidden from
# --help, one deprecation line: corp.config.to_fields); usage errors as one `error:` line.
_SCALARS = (int, float, str, bool)
_YAML_FLAG = (
    "config",
    Annotated[
        Optional[str],
        tyro.conf.arg(help="YAML file of options (flags override it).", help_behavior_hint=""),
        tyro.conf.DisallowNone,
    ],
)


def _flag_type(option: str, tp) -> tuple[type, str | None]:
    """What tyro parses `--OPTION` as, for a config field of type `tp`, and its metavar (None: tyro's): a list
    field as one word of text (`FLOAT,...`), a scalar as itself, a scalar or a word (`float | str`: ES's
    `--sigma`, a number or auto) as text, which `check_types` reads as the first type that takes it; a type no
    flag can give is refused when the command is made."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = members[0]
        if tp in _SCALARS and tp is not str and str in members:
            return str, f"{tp.__name__.upper()}|WORD"
    if typing.get_origin(tp) is list:
        return str, f"{typing.get_args(tp)[0].__name__.upper()},..."
    if tp not in _SCALARS:
        raise TypeError(
            f"config option '{option}' is a {tp}, which has no flag form; use int, float, str, bool or a list"
        )
    return tp, None


def _flag_field(option: str, tp, help_: str, default: Any = None) -> tuple:
    """The field of the flags dataclass that tyro makes `--OPTION` of; `default` is only shown (the value is
    None, or False for a switch, when the flag is not given). A bool field is a switch: `--flag` alone."""
    shown = ",".join(map(str, default)) if isinstance(default, list) else default
    hint = f"(default: {shown})" if shown not in (None, "") else ""  # tyro's own would show the None
    flag_tp, metavar = _flag_type(option, tp)
    arg = tyro.conf.arg(help=help_, help_behavior_hint=hint, metavar=metavar)
    if flag_tp is bool:
        return option, Annotated[bool, arg, tyro.conf.FlagCreatePairsOff], dataclasses.field(default=False)
    return option, Annotated[Optional[flag_tp], arg, tyro.conf.DisallowNone], dataclasses.field(default=None)


def flags_of(cls: type, old_flags: bool = True) -> type:
    """The dataclass tyro parses `corp NAME`'s arguments into, for config dataclass `cls`: a field per option
    (corp.config, "Option names"), named as it, with the config field's docstring and default as its help;
    with `old_flags`, each renamed option's old flag too (the parsed arguments; `--help` shows the class
    without them); and `--config`."""
    hints, docs, names = typing.get_type_hints(cls), field_docs(cls), option_names(cls)
    specs = [
        _flag_field(names[f.name], hints[f.name], docs.get(f.name, ""), _default(f))
        for f in dataclasses.fields(cls)
        if f.name in names  # not the class's `not_options`
    ]
    if old_flags:
        specs += [
            _flag_field(old, hints[new], f"Deprecated: use {flag(names[new])}.")
            for old, new in renamed_options(cls).items()
        ]
    return dataclasses.make_dataclass(f"{cls.__name__}Flags", [*specs, _YAML_FLAG + (dataclasses.field(default=None),)])


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def parse_flags(cls: type, flags: type, args: list[str], prog: str, about: str) -> dict:
    """The flags given in `args`, by option name (those not given left out), parsed by tyro into dataclass
    `flags` (`flags_of(cls)`); `--help` prints config `cls`'s options without the old flags, a class built
    only then (not at every start of `corp`). A usage error is one `error:` line."""
    if "--help" in args or "-h" in args:
        try:
            tyro.cli(flags_of(cls, old_flags=False), args=["--help"], prog=prog, description=about)
        except SystemExit:
            raise typer.Exit(0) from None
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # tyro's error box: read back as one line below
            parsed = tyro.cli(flags, args=args, prog=prog, description=about, add_help=False)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        typer.echo(f"error: {_one_line(said.getvalue())} (see `{prog} --help`)", err=True)
        raise typer.Exit(2) from None
    sys.stderr.write(said.getvalue())
    return {k: v for k, v in vars(parsed).items() if v is not None and v is not False}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RULE = re.compile(r"^[─╰╯ -]*$")  # a blank line, a rule, the box's bottom


def _one_line(box: str) -> str:
    """tyro's error box as one line: its first paragraph after the title (the message; then come tyro's
    details and its pointer to --help, which the line ends with), borders and colours stripped, wrapped
    lines joined."""
    lines = [ln.strip().strip("│").strip() for ln in _ANSI.sub("", box).strip().splitlines()]
    rows = []
    for body in lines[1:]:  # the first: the title, in the box's top border (or alone, without box characters)
        if _RULE.match(body):
            if rows:
                break
            continue
        rows.append(body)
    return " ".join(rows) or "invalid arguments"


def config_command(name: str, cls: type, help_text: str):
    """Register `corp NAME` whose options are the fields of config dataclass `cls` (`flags_of`, parsed by tyro):
    it builds the config (defaults <- `--config` <- the flags given) and calls the decorated runner with it.
    The command takes its arguments as they are (typer leaves them to tyro; `--help` included)."""
    flags = flags_of(cls)  # a field no flag can give: refused here

    def decorator(runner: Callable[[object], None]):
        def command(ctx: typer.Context) -> None:
            given = parse_flags(cls, flags, list(ctx.args), f"corp {name}", help_text)
            yaml_path = given.pop("config", None)
            fields = _run(to_fields, cls, given)  # flags -> fields; an old flag: one deprecation line
            cfg = _run(load_config, cls, yaml_path, fields)
            _run(runner, cfg)  # the config as the argument: Ctrl-C names its --output-dir

        command.__name__ = name.replace("-", "_")
        settings = {"allow_extra_args": True, "ignore_unknown_options": True}
        app.command(name, help=help_text, add_help_option=False, context_settings=settings)(command)
        return runner

    return decorator


def method_command(method: Method) -> None:
    """`corp NAME` for a registered method: build its config, run it, print its summary."""

    def runner(cfg) -> None:
        report = run_config(cfg, method).report  # the Python API's path (corp.api): the CLI only parses
        text = method.summarise(report)
        if text:
            typer.echo(text)

    config_command(method.name, method.config, method.help)(runner)


for _method in methods():
    method_command(_method)


# `corp bench`'s longer options, as annotations (typer reads an option from its parameter's annotation)
_WriteInto = Annotated[
    Optional[list[str]],  # a list option: Annotated, since a list default may not be a call (B008)
    typer.Option(
        "--write-into",
        metavar="FILE",
        help=(
            "Fill this file's `<!-- corp bench readme -->` / `<!-- corp bench protocol -->` blocks (each closed "
            "by `<!-- /corp bench PART -->`) from this bench's latest outputs, computing nothing; repeatable "
            "(README.md, docs/bench.md). Unset: no file is written."
        ),
    ),
]
_BenchTask = Annotated[
    Optional[str],
    typer.Option(
        "--task",
        help=(
            "Run only the cells of this task of the config, by spec or label (one process per task can share a "
            "bench); the outputs still cover every finished cell."
        ),
    ),
]
_BenchMethods = Annotated[
    Optional[str],
    typer.Option(
        "--methods",
        help=(
            "Run only the cells of these methods, comma-separated (variant labels such as corp-r4, or registry "
            "names); to split one task over processes, give each process whole noise schemes (a population is "
            "scored by the first cell that needs it)."
        ),
    ),
]
_BenchExecutor = Annotated[
    Optional[str],
    typer.Option(
        "--executor",
        help=(
            "Where cells run: local (this process) or ray (each cell a Ray task with its threads or GPU, shared "
            "populations scored by Ray actors; the same outputs). Overrides the config."
        ),
    ),
]
_BenchReportTo = Annotated[
    str,
    typer.Option(
        "--report-to",
        help=(
            "Also log every finished cell's accuracy at its budget: "
            "none, tensorboard (RESULTS_DIR/NAME/tensorboard), wandb."
        ),
    ),
]


@app.command("bench")
def bench_cmd(
    config: str = typer.Option(
        ..., "--config", help="Bench YAML (fields: corp.bench.config.BenchConfig, e.g. configs/bench-cpu.yaml)."
    ),
    readme_section: bool = typer.Option(
        False,
        "--readme-section",
        help="Print the README results section from this bench's latest outputs (computes nothing).",
    ),
    write_into_files: _WriteInto = None,
    threads: Optional[int] = typer.Option(
        None, "--threads", help="Torch CPU threads of every cell (overrides the config)."
    ),
    report_only: bool = typer.Option(
        False,
        "--report-only",
        help="Write results.csv, table.md and plots from the cells finished so far; run nothing.",
    ),
    task: _BenchTask = None,
    methods: _BenchMethods = None,
    executor: _BenchExecutor = None,
    workers: Optional[int] = typer.Option(
        None, "--workers", help="--executor ray on a local Ray: cells at once, and actors per shared population."
    ),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", help="--executor ray: join this Ray cluster instead of starting a local one."
    ),
    report_to: _BenchReportTo = "none",
) -> None:
    """The matched-compute sweep: every registered bench method at each FLOP budget, seed and data setting; resumable."""

    _run(check_report_to, report_to)  # a backend that is not installed: one line, before any cell runs
    where = {"executor": executor, "workers": workers, "ray_address": ray_address}
    cfg = _run(load_bench_config, config, {"threads": threads, **where})
    if readme_section:
        typer.echo(_run(section, cfg), nl=False)
        return
    if write_into_files:
        for path in write_into_files:
            parts = _run(write_into, cfg, path)
            typer.echo(f"{path}: wrote the {', '.join(parts)} block(s) from {cfg.results_dir}/{cfg.name}")
        return
    summary = _bench_sweep(cfg, config, threads, report_only, task, methods)
    _echo_bench_summary(summary, report_to)


def _bench_sweep(cfg, config: str, threads: int | None, report_only: bool, task: str | None, methods: str | None):
    """`corp bench` but --readme-section: run the cells the flags select (none with --report-only) and
    write the outputs; returns run_bench's summary."""
    # where the cells ran (--executor, --workers, --ray-address; like --task and --methods) is left out of the
    # command the outputs cite: they are the same outputs, and --report-only rewrites them byte for byte
    command = "corp bench --config " + config + (f" --threads {threads}" if threads else "")
    only = None if methods is None else comma_list(methods)
    return _run(run_bench, cfg, command, True, not report_only, task, only, interrupted="bench")


def _echo_bench_summary(summary: dict, report_to: str) -> None:
    """What `corp bench` wrote (cells, outputs, what is missing), then its cells logged to --report-to."""
    typer.echo(
        f"{summary['cells']} cells ({summary['reused']} reused from earlier runs, {summary['not_run']} not run); wrote "
        f"{summary['results_dir']}/results.csv, table.md, {len(summary['plots'])} plots"
        + (f"; missing (not run): {', '.join(summary['missing'])}" if summary["missing"] else "")
    )
    if report_to != "none":
        from pathlib import Path

        logged = _run(export_bench_results, Path(summary["results_dir"]), report_to)
        typer.echo(f"--report-to {report_to}: {logged} finished cells logged")


@app.command("apply")
def apply_cmd(
    recipe: str = typer.Argument(
        ..., help="recipe.json written by a method that makes one (`corp consolidate`, `corp es`)."
    ),
    out: str = typer.Option(
        ...,
        "--out",
        help="New directory to write the rebuilt Hugging Face model to (an earlier corp model there is replaced).",
    ),
    model: Optional[str] = typer.Option(
        None, "--model", help="Base model to apply it to (default: the recipe's); must have the recipe's weights."
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help=(
            "Replace --out even if it has no corp marker itself, when all it holds is models corp wrote "
            "(never a file of yours, a run directory, a cache, the base model or the current directory)."
        ),
    ),
    allow_mismatch: bool = typer.Option(
        False,
        "--allow-mismatch",
        help=(
            "Write the model even when an edited recipe no longer "
            "rebuilds the model its run evaluated (its weights hash)."
        ),
    ),
) -> None:
    """Rebuild a model from its recipe and the base model, bit-exactly, and check it is the model its run
    evaluated; never deletes files corp did not write."""

    path = _run(apply_recipe, recipe, out, model, overwrite, allow_mismatch, interrupted="apply")
    typer.echo(f"wrote {path}")


@app.command("models")
def models_cmd(
    prepare: str = typer.Option(
        "", "--prepare", help="An embedded alias to convert into corp's cache now (once), instead of on first use."
    ),
) -> None:
    """List model aliases and what is available on this machine."""

    if prepare:
        model_id, path = _run(resolve_model, prepare, interrupted="prepare")
        typer.echo(f"{prepare}: {model_id}, ready in {path}")
        return
    for row in list_models():
        typer.echo(f"{row['alias']:<14} {row['model']:<38} {row['status']}")
        if row.get("build"):  # an embedded build: what it is, and the hash every run records for it
            typer.echo(f"{'':<14} {row['build']}; weights sha256 {row['weights_sha256']}; license {row['license']}")


@app.command("tasks")
def tasks_cmd() -> None:
    """List tasks and their options."""

    for row in list_tasks():
        typer.echo(f"{row['task']:<12} {row['description']}")


if __name__ == "__main__":
    app()
