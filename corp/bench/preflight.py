"""Every check of a bench that needs no generation, before any compute: the results directory and
its records, each cell's options built into its config, budgets too small for a method, and
comparisons naming a row no cell can report."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from corp.bench.budget import min_budget
from corp.bench.config import BenchConfig, results_path
from corp.bench.plan import Cell, check_compare, clip_to_units, list_values, min_units
from corp.bench.records import check_record
from corp.config import check_types, in_scales, load_config
from corp.errors import CorpError
from corp.evaluate.tasks import SplitSizes, get_task, make_splits
from corp.method import FIXED, POPULATION
from corp.methods import get_method
from corp.runtime.backends import make_backend
from corp.runtime.runs import check_writable


def check_existing_results(cfg: BenchConfig) -> Path:
    """The results directory, if there, is a directory whose cell records all read back (nothing is written)."""
    out = results_path(cfg)
    if out.exists() and not out.is_dir():
        raise CorpError(f"results directory '{out}' is a file; set results_dir/name to a directory")
    with _permissions(out):
        for rec in sorted((out / "cells").glob("*.json")) if (out / "cells").is_dir() else []:
            _check_record(rec)
    return out


def check_results_dir(cfg: BenchConfig) -> Path:
    """The results directory and its cells/, made and checked writable: only once the whole config
    passed, so a refused bench leaves nothing behind."""
    out = results_path(cfg)
    with _permissions(out):
        (out / "cells").mkdir(parents=True, exist_ok=True)
        check_writable(out, ".corp-bench-write-test.")
    return out


@contextmanager
def _permissions(out: Path):
    try:
        yield
    except OSError as exc:
        raise CorpError(
            f"results directory '{out}' cannot be read or written ({type(exc).__name__}: "
            f"{exc}); fix its permissions or choose another results_dir"
        ) from None


def _check_record(rec: Path) -> None:
    """A cell record that does not parse (cut short by a full disk or a kill mid-copy), or parses
    but is not a cell record of any edition (another file under its name), is damaged, not a
    permissions problem: one line naming it and what to do. The bench never reruns its cell over it."""
    try:
        obj = json.loads(rec.read_text())
        check_record(obj if isinstance(obj, dict) else {}, where="its JSON")
    except (json.JSONDecodeError, UnicodeDecodeError, CorpError) as exc:
        why = str(exc).split(";")[0] if isinstance(exc, CorpError) else str(exc)
        raise CorpError(
            f"bench record '{rec}' is damaged ({why}); move it aside (e.g. to '{rec.name}.damaged') and rerun: "
            "its cell runs again"
        ) from None


def _validate_options(
    cell: Cell, splits: dict | None = None, population: int | None = None, sigmas: list | None = None
) -> None:
    """Build the cell's config without running it: unknown or bad options, what the adapter's
    `check` finds wrong against the cell's splits, a list option no prefix of the bench's
    `population` can ever fit (RandOpt's top_k), and a `from_sigmas` that names a scale the bench's
    `sigmas` grid does not have, fail here, before compute."""
    method, adapter = get_method(cell.method), cell.adapter
    opts = {k: v for k, v in cell.opts.items() if k not in ("from_run", "from_sigmas")}
    try:
        opts = check_types(method.config, opts)  # before the clipping below reads them as numbers
        chosen = cell.opts.get("from_sigmas")
        if chosen is not None:
            if adapter.kind != POPULATION or opts.get("race", "off") != "off":
                raise CorpError(
                    "from_sigmas takes specialists of the shared population; only a population "
                    "method without racing reads one"
                )
            grid = [float(x) for x in (sigmas or [])]
            values = [float(x) for x in list_values(chosen)]
            odd = [x for x in values if not in_scales(x, grid)]
            if not values or odd:
                raise CorpError(
                    f"from_sigmas {odd[0] if odd else '[]'} is not a scale of the bench's sigmas "
                    f"({', '.join(f'{g:g}' for g in grid)}); pick a non-empty subset of those"
                )
        if adapter.kind == POPULATION and population is not None and opts.get("race", "off") == "off":
            # a cell's population is a prefix of the shared one (a raced cell races its own, as large as fits)
            for key in adapter.clip:
                too_big = [int(v) for v in list_values(opts.get(key)) if int(v) > population]
                if too_big:
                    raise CorpError(
                        f"{key} {max(too_big)} can never fit the bench's population of {population} "
                        f"specialists; lower {key} or raise population"
                    )
        if adapter.unit:
            opts[adapter.unit] = max(min_units(cell), int(opts.get(adapter.unit) or min_units(cell)))
            clip_to_units(opts, adapter)
        built = load_config(method.config, None, opts)
        if adapter.check is not None and splits is not None:
            adapter.check(built, splits)
    except CorpError as exc:
        raise CorpError(f"bench config: method '{cell.method}' (variant '{cell.label}'): {exc}") from None


def preflight(cfg: BenchConfig, cells: list[Cell], load_model: bool = True) -> dict:
    """Every check that needs no generation. Returns {(task, setting-of-sizes): min FLOPs info}."""

    check_existing_results(cfg)
    splits_of: dict[tuple, dict] = {}
    for cell in cells:
        sizes = (
            cell.task,
            cell.opts["n_support"],
            cell.opts["n_probe"],
            cell.opts["n_validation"],
            cell.opts["n_test"],
        )
        if sizes not in splits_of:
            task = get_task(cell.task, cfg.data)
            splits_of[sizes] = make_splits(
                task, SplitSizes(*sizes[1:]), cfg.split_seed
            )  # a test size beyond the pool fails here
        _validate_options(cell, splits_of[sizes], cfg.population, cfg.sigmas)
    check_compare(cfg, cells)
    info = _check_budgets(cfg, cells, splits_of) if load_model else {}
    check_results_dir(cfg)  # made now that the config passed
    return info


def _check_budgets(cfg: BenchConfig, cells: list[Cell], splits_of: dict[tuple, dict]) -> dict:
    """A budget no method can fit is bad input (the model is loaded to count its parameters and the
    prompts' tokens). Returns {"n_params": ...}, or {} when no cell has a budget."""
    budgeted = [c for c in cells if c.adapter.kind != FIXED]
    if not budgeted:
        return {}

    backend = make_backend(cfg.backend, cfg.model, cfg.device, cfg.dtype, cfg.batch_size)
    tok = backend.tokenizer  # hf and vllm both tokenise on the host (the backend contract)
    n_params = int(backend.n_params)
    prompt_tokens: dict[tuple, int] = {}
    below: dict[float, list[str]] = {}
    for cell in budgeted:
        sizes = (
            cell.task,
            cell.opts["n_support"],
            cell.opts["n_probe"],
            cell.opts["n_validation"],
            cell.opts["n_test"],
        )
        if sizes not in prompt_tokens:
            support = splits_of[sizes]["support"]
            prompt_tokens[sizes] = sum(len(tok(e.prompt)["input_ids"]) for e in support)
        adapter = cell.adapter
        need = min_budget(
            adapter.unit_evals(cell.opts), min_units(cell), n_params, prompt_tokens[sizes], cell.opts["n_support"]
        )
        if cell.spend < need:
            below.setdefault(cell.budget, []).append(f"{cell.label} needs at least {need:.3g}")
    # a budget some methods cannot fit runs (those cells say 'does not fit'); one no method can fit is bad input
    labels = {c.label for c in budgeted}
    for budget in cfg.budgets:
        short = below.get(budget, [])
        if {x.split(" needs")[0] for x in short} >= labels:
            raise CorpError(
                f"bench config: budget {budget:.3g} FLOPs is too small for every method "
                f"({'; '.join(sorted(set(short)))}); raise or remove it"
            )
    del backend
    return {"n_params": n_params}
