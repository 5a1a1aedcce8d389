"""table.md's section on searched values that landed on the edge of their grid (issue 55): the bench's
tuning choices (a final cell's options against its method's `search:` grid) and what the cells' own runs
flagged (CoRP's alpha, q and beta, RandOpt's top-1 sigma: report.json's `edge_flags`, kept in a cell's
detail since issue 55)."""

from __future__ import annotations

from corp.bench.config import BenchConfig, budget_text
from corp.bench.search import edge_flags
from corp.grids import edge_line


def _budget(b) -> str:
    return "fixed" if b is None else budget_text(b)


def _tuning_lines(cfg: BenchConfig, records: list[dict]) -> list[str]:
    """One line per (task, variant, budget) whose tuned options sit on an edge of the searched grid."""
    lines: dict[str, None] = {}
    for rec in records:
        space = ((cfg.methods.get(rec["method"]) or {}).get("search")) or {}
        chosen = (rec.get("tuning") or {}).get("chosen") or {}
        for flag in edge_flags(space, chosen):
            where = f"{rec['label']} on {cfg.label(rec['task'])} at {_budget(rec['budget'])}"
            lines[f"- tuning, {where}: {edge_line(flag)}."] = None
    return list(lines)


def _run_lines(records: list[dict]) -> list[str]:
    """Per variant and flagged value: in how many of its final cells the run's own search hit that edge."""
    finals = [r for r in records if r.get("setting") != "tune" and r.get("rows")]
    counts: dict[tuple, int] = {}
    for rec in finals:
        for flag in (rec.get("detail") or {}).get("edge_flags") or []:
            key = (rec["label"], flag["name"], flag["edge"])
            counts[key] = counts.get(key, 0) + 1
    out = []
    for (label, name, side), k in sorted(counts.items()):
        n = sum(1 for r in finals if r["label"] == label)
        out.append(f"- run, {label}: {name} at its grid's {side} in {k} of {n} final cells.")
    return out


def edge_section(cfg: BenchConfig, records: list[dict]) -> list[str]:
    """The section ([] when nothing landed on an edge)."""
    lines = _tuning_lines(cfg, records) + _run_lines(records)
    if not lines:
        return []
    return [
        "## Searched values on the edge of their grid",
        "",
        "A value chosen at the smallest or largest point of its grid may have a better one beyond it: widen the "
        "grid there (a grid of two values always flags its choice).",
        "",
        *lines,
        "",
    ]
