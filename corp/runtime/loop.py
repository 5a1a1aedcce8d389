"""The driver iterative methods share (issue 38): ES, GRPO and its variants, FGRPO, F-TIS, FERA,
and fedcorp's ending.

evosax's split, for a run that must resume: a method supplies its math as a `Steps` object (resume
its state, take one step, save its state); `run_steps` owns the rest of the loop: which step comes
next, when the state is saved, the metrics log (`metrics.jsonl`, `rounds.jsonl`) and `--report-to`,
the progress bar, and a non-finite metric. At the end the method states what it produced as
`Outputs` (its report rows and fields, its training ledger, its model, its recipe) and `finish`
writes them, the same way for every method: the recipe, then the saved model, then the report that
names both, with the ledger and the table. `method_rows` builds the two report rows most such
methods end with (the base and the trained model on the test split).

Resume rule, the same for every method: a step's row is logged before its state is saved, and on
resume the rows past the saved state are dropped and their steps redone. So a kill between the two
writes, or a checkpoint every N steps, never leaves a row the state does not hold, and never loses
one it does (the redone step's evaluations come from the run's caches, its training from the saved
state and its seed).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from corp.algorithms.recipe import write_recipe
from corp.algorithms.stats import PerExample
from corp.errors import CorpError
from corp.grids import outside_flags
from corp.runtime.context import open_run
from corp.runtime.ledger import Ledger
from corp.runtime.models import save_model
from corp.runtime.progress import progress_disabled
from corp.runtime.runs import ReportRow, append_jsonl, format_rows, read_jsonl, write_report


class Steps(ABC):
    """One iterative method's loop, as `run_steps` drives it. The method keeps its state on the
    object (a tensor dict, a list of seed components) in whatever format its checkpoint has."""

    desc: str  # the progress bar's label ("es", "grpo[grpo]", "fgrpo")
    unit: str = "step"  # the progress bar's unit ("iter", "round")
    key: str = "step"  # the counter field of a metrics row: the step it ends (1 for the first)
    metrics_path: Path  # the metrics log the rows go to
    total: int  # the steps asked for
    checkpoint_every: int = 1  # save the state every N steps (and after the last)
    finite: tuple[str, ...] = ()  # metrics that must stay finite (a loss); else one line, the run stops
    finite_hint: str = ""  # what to do when one does not (for the error line)

    @abstractmethod
    def resume(self) -> int:
        """Load the saved state if there is one, else start; return the steps it holds."""

    @abstractmethod
    def step(self, t: int) -> dict | list[dict]:
        """Take step t (0-based) and return its metrics row (`row[self.key] == t + 1`), or its rows
        (one per node, for a method that trains several models together)."""

    @abstractmethod
    def save(self) -> None:
        """Write the state (atomically: a kill leaves the old state or the new one)."""

    def postfix(self, row: dict) -> dict:
        """What the progress bar shows after a step (its last row)."""
        return {}

    def mine(self, row: dict) -> bool:
        """Whether a logged row is this loop's (a log may hold other arms' or settings' rows, which
        the loop leaves as they are)."""
        return True


def run_steps(ctx, steps: Steps) -> list[dict]:
    """Run `steps` from its saved state to `steps.total`; return every metrics row the state holds
    (a resumed run's earlier rows first). `ctx` is the run's context (`ctx.log_row` writes a row and
    hands it to --report-to live)."""
    done = steps.resume()
    path = steps.metrics_path
    found = read_jsonl(path, key=steps.key)
    keep = [r for r in found if not steps.mine(r) or r[steps.key] <= done]
    if len(keep) != len(found):  # rows logged past the saved state: their steps are redone
        path.write_text("")
        for r in keep:
            append_jsonl(path, r)
    # this loop's rows, a row repeated by a crash between a write and its bookkeeping counted once
    first: dict[tuple, dict] = {}
    for r in keep:
        if steps.mine(r):
            first.setdefault((r.get("node"), r[steps.key]), r)
    rows = list(first.values())
    bar = tqdm(
        total=steps.total,
        initial=min(done, steps.total),
        desc=steps.desc,
        unit=steps.unit,
        dynamic_ncols=True,
        disable=progress_disabled(),
    )
    try:
        for t in range(done, steps.total):
            new = steps.step(t)
            new = [new] if isinstance(new, dict) else new
            for row in new:
                bad = [k for k in steps.finite if not math.isfinite(row[k])]
                if bad:
                    raise CorpError(
                        f"{steps.key} {row[steps.key]}: the {bad[0]} became non-finite; {steps.finite_hint}"
                    )
            for row in new:
                ctx.log_row(path, row)  # also to --report-to, live
                rows.append(row)
            if (t + 1) % steps.checkpoint_every == 0 or t + 1 == steps.total:
                steps.save()
            bar.set_postfix(**steps.postfix(row))
            bar.update(1)
    finally:
        bar.close()
    return rows


def method_rows(
    n_params: int, label: str, before: dict | None, after: dict | None, labelled: int, ids, extra: dict | None = None
) -> list[ReportRow]:
    """The report rows an iterative method ends with: "base" (`before`, the base on the test split)
    and `label` (`after`, the trained model), each charged its own test generation; a row whose
    evaluation was skipped (None) is left out. `labelled`: the labelled examples the method used."""
    out = []
    for name, r, used, more in (("base", before, 0, None), (label, after, labelled, extra)):
        if r is not None:
            spent = Ledger(n_params).add_generation(r["prompt_tokens"], r["generated_tokens"])
            rewards = PerExample(r["rewards"], ids) if r.get("rewards") is not None else None
            out.append(
                ReportRow(name, r["accuracy"], 1, spent, used, PerExample(r["correct"], ids), dict(more or {}), rewards)
            )
    return out


LEDGER_FIELDS = ("training_ledger", "method_ledger")


@dataclass
class Outputs:
    """What an iterative method produced, for `finish` to write. The method computes; it writes
    nothing of its own beyond its state and metrics log."""

    rows: list[ReportRow]  # the report rows on the test split (empty: the test evaluation was skipped)
    compare: list[tuple[str, str]]  # pairs (a, b) whose difference a - b the report states, with its interval
    ids: list[str] | None  # the test examples' ids, in the rows' order (None: no test evaluation)
    fields: dict = field(default_factory=dict)  # the method's own report fields (settings, per-round rows, notes)
    ledger: Ledger | None = None  # the compute toward the output (training or the clients'), in the report
    # its field: "training_ledger" (ES, GRPO), or "method_ledger" with "method_flops" beside it (the
    # federated methods, whose ledger sums the clients' compute; corp bench reads method_flops)
    ledger_field: str = "training_ledger"
    model: tuple | None = None  # (model, tokenizer): saved as a normal HF directory, run_dir/model
    recipe: dict | None = None  # corp.algorithms.recipe.make_recipe's record: written to run_dir/recipe.json
    notes: Callable[[dict], list[str]] | None = None  # lines under the rows' table, from the written report
    model_name: str | None = None  # the report's model (the config's --model if None)
    table: Callable[[dict], str] | None = None  # the terminal table from the written report (None: rows + notes)
    # files of the recipe beside it, by name in the run directory (a low-rank recipe's factors, which the
    # recipe pins by sha256): written before the recipe; None removes a stale one an earlier run left
    files: dict[str, bytes | None] = field(default_factory=dict)
    # other outputs (a LoRA adapter): each is called with the run directory after the model is saved;
    # the method states what they write in `fields` itself
    exports: list[Callable[[Path], None]] = field(default_factory=list)
    # where in `fields` the method's stage timings are (CoRP's ("corp", "seconds")): the writes' seconds go
    # there as "save" (benchmarks/bench_stages.py reads them)
    timings: tuple[str, ...] = ()
    measure: str | None = None  # what the rows compare: "accuracy" or "reward" (None: the run's, ctx.measure)
    # what the returned report carries that report.json does not, because it has a file of its own (eval's
    # retention, in retention.json)
    shown: dict = field(default_factory=dict)
    # False: no report.json; the exports write the run's summary (analyze-rank's rank_summary.json, the file
    # its Method.report names) and finish returns `fields`, with the table
    report: bool = True


def _fields(out: Outputs) -> dict:
    """The report's fields `out` gives, with the edge flags of values the caller's own search chose for
    this run's options (corp.grids.chosen_outside: corp bench's tuning), after the run's own."""
    fields = dict(out.fields)
    if outside_flags():
        fields["edge_flags"] = [*(fields.get("edge_flags") or []), *outside_flags()]
    return fields


def finish(ctx, out: Outputs) -> dict:
    """Write what `out` holds: the recipe's files and the recipe, then the model, then the exports (so
    the report never names a file that is not there), then report.json and test_outcomes.json (unless
    `out.report` is False); return the report with its table."""
    if out.rows and not out.report:
        raise ValueError("Outputs with rows need report=True: the rows' comparisons are in report.json")
    fields = _fields(out)
    if out.ledger is not None:
        if out.ledger_field not in LEDGER_FIELDS:
            raise ValueError(f"ledger_field must be one of {LEDGER_FIELDS}, not {out.ledger_field!r}")
        fields[out.ledger_field] = out.ledger.to_dict()
        if out.ledger_field == "method_ledger":
            fields["method_flops"] = out.ledger.flops
    t0 = time.perf_counter()
    fields.update(_write_outputs(ctx.run_dir, out))
    if out.timings:  # beside what the method timed of making them
        stages = _stage_seconds(fields, out.timings)
        stages["save"] = round(stages.get("save", 0.0) + time.perf_counter() - t0, 3)
    for export in out.exports:
        export(ctx.run_dir)
    cfg = ctx.cfg
    measure = out.measure or ctx.measure
    if out.report:
        report = write_report(
            ctx.run_dir,
            ctx.method,
            out.model_name or cfg.model,
            cfg.task,
            out.rows,
            out.compare,
            out.ids,
            measure,
            **fields,
        )
    else:
        report = fields
    report.update(out.shown)
    if out.table is not None:
        report["table"] = out.table(report)
    elif out.rows:
        notes = out.notes(report) if out.notes else []
        report["table"] = "\n".join([format_rows(out.rows, report["comparisons"], measure=measure), *notes])
    return report


def _write_outputs(run_dir: Path, out: Outputs) -> dict:
    """The files of `out` but the report, in their order; return the report fields naming them."""
    fields = {}
    for name, data in out.files.items():
        if data is None:
            (run_dir / name).unlink(missing_ok=True)  # a stale file from an earlier run here must not look current
        else:
            tmp = run_dir / (name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(run_dir / name)
    if out.recipe is not None:
        write_recipe(run_dir / "recipe.json", out.recipe)
        fields["recipe"] = str(run_dir / "recipe.json")
        fields["recipe_bytes"] = (run_dir / "recipe.json").stat().st_size
    if out.model is not None:
        model, tokenizer = out.model
        save_model(model, tokenizer, run_dir / "model")
        fields["model_dir"] = str(run_dir / "model")
    return fields


def _stage_seconds(fields: dict, path: tuple[str, ...]) -> dict:
    node = fields
    for key in path:
        node = node[key]
    return node


def drive(
    cfg, method: str, backend, work: Callable, needs=("support", "test"), defines="auto", host_copy="beside"
) -> dict:
    """One run from start to end, the same for every method: open the run directory (`open_run`: the
    lock, the splits, complete or failed), let the method compute (`work(ctx) -> Outputs`), write
    what it made (`finish`), and close the run. The method writes none of the run's outputs itself.
    `host_copy`: what its vLLM run holds on the host beside the engine (corp.runtime.context.lifecycle's
    HOST_COPIES: None for a method that only scores), for the memory check before any work."""
    with open_run(cfg, method, backend, needs=needs, defines=defines, host_copy=host_copy) as ctx:
        return finish(ctx, work(ctx))
