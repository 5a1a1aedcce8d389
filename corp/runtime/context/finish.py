"""What a run writes as it ends, beside its report: the model card of RUN_DIR/model and --report-to's
export; a write the machine refuses (a full disk) is one line naming the path."""

from __future__ import annotations

import warnings

from corp.cards import run_model_card
from corp.config import config_to_dict
from corp.errors import CorpError
from corp.runtime.context.run_context import RunContext
from corp.runtime.runs import write_failure
from corp.tracking import export_run_metrics, parse_report_to


def write_refused(what: str, where, exc: BaseException, ctx: RunContext) -> CorpError:
    """One line for a write the machine refused (a full disk or quota, a read-only place), naming the path."""
    path = getattr(exc, "filename", None) or where
    return CorpError(
        f"could not write {what} '{path}' ({write_failure(exc)}); free some space, then rerun with "
        f"--output-dir {ctx.run_dir} (nothing computed is lost)"
    )


def write_run_card(ctx: RunContext) -> None:
    """The model card of `RUN_DIR/model`, when the run saved one (the one place run models get it)."""
    try:
        run_model_card(
            ctx.run_dir,
            ctx.method,
            {"method": ctx.method, **config_to_dict(ctx.cfg)},
            ctx.model_id,
            ctx._weights_hash,
            ctx.splits,
        )
    except Exception as exc:  # noqa: BLE001 -- model and report are written; only a full disk fails the run
        if write_failure(exc) is not None:
            raise write_refused("the model card", ctx.run_dir / "model", exc, ctx) from None
        warnings.warn(f"model card for '{ctx.run_dir / 'model'}' not written: {type(exc).__name__}: {exc}")


def export_report_to(ctx: RunContext, fail_on_write: bool = False) -> None:
    """--report-to at the end of a run, whether it completed or not: the live writers closed, or,
    when no row went to them live (nothing new written, or a backend failed), the run's record
    exported to TensorBoard / W&B."""
    live, ctx.live = ctx.live, None
    try:
        if live is not None and live.started:
            live.close()
            return
        if live is not None:
            live.close()
        config = {"method": ctx.method, **config_to_dict(ctx.cfg)}
        read = export_run_metrics(ctx.run_dir, getattr(ctx.cfg, "report_to", "none"), config)
        if fail_on_write and not read and parse_report_to(getattr(ctx.cfg, "report_to", "none")):
            warnings.warn(
                f"--report-to {ctx.cfg.report_to}: corp {ctx.method} logged no metrics in this run, so nothing was "
                "written (specialists scored here, es iterations, grpo and ftis steps, fgrpo and fera rounds are logged)"
            )
    except Exception as exc:  # noqa: BLE001 -- the JSONL record is written; a failing tracker must not hide the outcome
        if fail_on_write and write_failure(exc) is not None:
            raise write_refused(f"--report-to {ctx.cfg.report_to}'s files", ctx.run_dir, exc, ctx) from None
        warnings.warn(f"--report-to {ctx.cfg.report_to}: metrics not exported: {type(exc).__name__}: {exc}")
