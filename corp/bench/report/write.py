"""Writing the outputs (results.csv, tuning.csv, table.md, bench.json, plots); the sections other
files take from them are `sections.py`'s."""

from __future__ import annotations

from pathlib import Path

from corp.bench import retention
from corp.bench.accounting import regime_rows
from corp.bench.config import BENCH_PROTOCOL, BenchConfig, headline_setting
from corp.bench.protocol import mark_primary
from corp.bench.report.edges import edge_section
from corp.bench.report.gate import gate_section
from corp.bench.report.plots import plots
from corp.bench.report.prose import beats_sentences, reading_lines
from corp.bench.report.rows import (
    TUNING_COLUMNS,
    comparisons,
    equivalence_tests,
    flat_rows,
    label_prior_rows,
    trial_flops,
    tuning_rows,
    write_csv,
)
from corp.bench.report.tables import equivalence_section, protocol_sections, table_md, time_table
from corp.runtime.runs import atomic_write_text, write_json


def _write_csvs(cfg: BenchConfig, records: list[dict], tuning: list[dict] | None, out: Path) -> list[dict]:
    """results.csv (every row, with the tasks' label priors) and tuning.csv (the trials); the rows."""
    rows = flat_rows(records)
    rows += label_prior_rows(cfg, [t for t in cfg.tasks if any(r["task"] == t for r in rows)])
    for r in rows:
        r["task_label"] = cfg.label(r["task"])
    write_csv(out / "results.csv", rows)
    if tuning:
        trials = tuning_rows(tuning)
        for r in trials:
            r["task_label"] = cfg.label(r["task"])
        # the third edition's trials: which seed, and what evaluating them on the tuning split cost (search)
        more = ["seed", "evaluation_flops"] if cfg.protocol_tables or len(cfg.tuning_seeds) > 1 else []
        write_csv(out / "tuning.csv", trials, TUNING_COLUMNS + more)
    return rows


def _notes(text: str, not_run: int, n_records: int, older: int) -> str:
    """table.md with what is not in it yet said under its heading: unrun final cells, older records."""
    if not_run:
        head, _, rest = text.partition("\n\n")
        text = (
            f"{head}\n\n**Incomplete: {not_run} of {not_run + n_records} "
            f"final (non-trial) cells not run yet** (rerun the command to continue).\n\n{rest}"
        )
    if older:
        head, _, rest = text.partition("\n\n")
        text = (
            f"{head}\n\n{older} cell record(s) of an older bench protocol are kept in cells/ and not used here "
            f"(their rows were made under other budget rules).\n\n{rest}"
        )
    return text


# bench.json's layout: 2 stores the regime rows and the reading less the registered sentences (the README
# section reads them as they are); a bench.json of layout 1 (no key) from a bench with either is refused there
REPORT_FORMAT = 2


def _bench_json(
    cfg, command, not_run, missing, made, comps, reading, older, retained, equivalences, primary, regime, out
) -> dict:
    """bench.json: the bench's settings, its comparisons and what each part of the report holds. `reading`:
    table.md's plain-words paragraphs less the registered comparisons' sentences (`primary` holds those
    comparisons, and the README shows them as a table); `regime`: the regime table's rows."""
    return {
        "name": cfg.name,
        "command": command,
        "cells_not_run": not_run,
        "model": cfg.model,
        "tasks": cfg.tasks,
        "seeds": cfg.seeds,
        "task_seeds": {cfg.label(t): cfg.seeds_of(t) for t in cfg.tasks},
        "budgets": cfg.budgets,
        "settings": cfg.settings,
        "missing": missing,
        "plots": made,
        "comparisons": comps,
        "beats": beats_sentences(comps),
        "reading": reading,
        "bench_protocol": BENCH_PROTOCOL,
        "report_format": REPORT_FORMAT,
        "older_protocol_records": older,
        **({"retention": retained} if retained is not None else {}),
        **({"equivalence": equivalences} if getattr(cfg, "equivalence_list", None) else {}),
        **({"regime": regime} if regime is not None else {}),
        # the third edition's (absent from an older bench's bench.json)
        **(
            {
                "primary": [
                    {k: r[k] for k in ("entry", "p", "p_holm", "reject")} | {"run": r["comparison"] is not None}
                    for r in primary
                ],
                "preregistration": str(out / "preregistration.json"),
            }
            if primary is not None
            else {}
        ),
    }


def write_outputs(
    cfg: BenchConfig,
    records: list[dict],
    missing: list[dict],
    command: str,
    not_run: int = 0,
    tuning: list[dict] | None = None,
    older: int = 0,
) -> dict:
    """`older`: cell records of an older bench protocol in the cells directory (kept, not reported; the tables say so)."""

    out = Path(cfg.results_dir) / cfg.name
    rows = _write_csvs(cfg, records, tuning, out)
    comps = comparisons(cfg, rows)
    primary = None
    if getattr(cfg, "primary_list", None):
        primary = mark_primary(cfg, comps)
        for r in primary:
            r["entry"] = {**r["entry"], "task_label": cfg.label(r["entry"]["task"])}
    reading = reading_lines(cfg, rows, comps, primary)
    times = time_table(cfg, records, tuning or [])
    regime = regime_rows(cfg, records, headline_setting(cfg)) if cfg.protocol_tables else None
    extra = protocol_sections(cfg, rows, records, tuning or [], regime)
    retained = None
    if cfg.retention:  # absent from an older config's outputs
        rets = retention.load_records(cfg, records)
        retained = retention.summarise(cfg, rows, rets)
        extra += retention.section(cfg, retained, retention.unscored(cfg, records, rets))
    equivalences = equivalence_tests(cfg, rows)
    if getattr(cfg, "equivalence_list", None):
        extra += equivalence_section(equivalences)
    extra += gate_section(records)  # what test says of CoRP's gate decisions (issue 55)
    extra += edge_section(cfg, records)  # searched values on the edge of their grid (issue 55)
    text = table_md(
        cfg, rows, comps, missing, command, trial_flops(tuning or []), reading, times, primary=primary, extra=extra
    )
    text = _notes(text, not_run, len(records), older)
    atomic_write_text(out / "table.md", text)
    made = plots(cfg, rows, out)
    if retained is not None:
        made += retention.plot(cfg, retained, out)
    write_json(
        out / "bench.json",
        _bench_json(
            cfg,
            command,
            not_run,
            missing,
            made,
            comps,
            reading_lines(cfg, rows, comps, primary, with_primary=False),
            older,
            retained,
            equivalences,
            primary,
            regime,
            out,
        ),
    )
    return {
        "results_dir": str(out),
        "rows": len(rows),
        "plots": made,
        "comparisons": len(comps),
        "missing": [m["method"] for m in missing],
    }
