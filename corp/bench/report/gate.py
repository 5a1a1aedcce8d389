"""What the test split says of CoRP's gate (issue 55): per CoRP variant, how often the gate deployed its
candidate and how often it kept the base, and, from the candidate's and the base's test accuracy, what each
decision cost or saved. The gate decides on the validation split; test is looked at only here, afterwards.

A cell records the candidate's test accuracy when the gate kept the base (`detail.candidate_test`) since
issue 55; an older record has no such number, and the table counts it as not recorded. The base's test
accuracy comes from the cell's own record, else from a `base` row or an abstained CoRP row (the base
itself) of the same task, setting and seed."""

from __future__ import annotations

from collections.abc import Iterable

Key = tuple[str, str, int]


def _key(rec: dict) -> Key:
    return rec["task"], rec["setting"], rec["seed"]


def _base_accuracy(records: Iterable[dict]) -> dict[Key, float]:
    """The base's test accuracy per (task, setting, seed), where some record holds it."""
    out: dict[Key, float] = {}
    for rec in records:
        for r in rec["rows"]:
            if r["name"] == "base" or r["report_row"].startswith("corp (abstained"):
                out.setdefault(_key(rec), r["accuracy"])
    return out


def corp_cells(records: Iterable[dict]) -> list[dict]:
    """The final CoRP cells that ran (a trial is scored on the tuning split, not test)."""
    return [
        rec
        for rec in records
        if "accepted" in (rec.get("detail") or {}) and rec.get("setting") != "tune" and rec.get("rows")
    ]


def decision(rec: dict, base: dict[Key, float]) -> tuple[bool, float | None, float | None]:
    """(deployed, the candidate's test accuracy, the base's), None where not recorded."""
    detail = rec["detail"]
    cand = detail.get("candidate_test") or {}
    own = next(r for r in rec["rows"] if not r.get("population_row"))
    deployed = bool(detail["accepted"])
    base_acc = cand.get("base_accuracy", own["accuracy"] if not deployed else base.get(_key(rec)))
    cand_acc = own["accuracy"] if deployed else cand.get("accuracy")
    return deployed, cand_acc, base_acc


def _count(diffs: list[float]) -> str:
    """'n (mean +x.xxx)': how many, and their mean test difference candidate - base."""
    return f"{len(diffs)} (mean {sum(diffs) / len(diffs):+.3f})" if diffs else "0"


def _row(name: str, cells: list[dict], base: dict[Key, float]) -> str:
    deployed_worse, cost, saved, tied = [], [], [], 0
    n_deployed = unknown_base = unknown_cand = 0
    for rec in cells:
        deployed, cand, ref = decision(rec, base)
        if deployed:
            n_deployed += 1
            if ref is None:
                unknown_base += 1
            elif cand < ref:
                deployed_worse.append(cand - ref)
        elif cand is None or ref is None:
            unknown_cand += 1
        elif cand > ref:
            cost.append(cand - ref)
        elif cand < ref:
            saved.append(cand - ref)
        else:
            tied += 1
    worse = _count(deployed_worse) + (f"; {unknown_base} with no base row" if unknown_base else "")
    kept = len(cells) - n_deployed
    return (
        f"| {name} | {len(cells)} | {n_deployed} | {worse} | {kept} | {_count(cost)} | {_count(saved)} | {tied} "
        f"| {unknown_cand} |"
    )


def gate_section(records: list[dict]) -> list[str]:
    """table.md's section on the gate's decisions against test ([] for a bench with no CoRP cell)."""
    cells = corp_cells(records)
    if not cells:
        return []
    base = _base_accuracy(records)
    labels = sorted({rec["label"] for rec in cells})
    lines = [
        "## The gate's decisions on test",
        "",
        "Per final CoRP cell, the gate (on the validation split) deployed its candidate or kept the base; the test "
        "split says afterwards what that cost. Kept, candidate better: the gate's cost; kept, candidate worse: what "
        "it saved; in brackets the mean test difference candidate − base. The candidate's test accuracy is "
        "recorded for cells that kept the base since issue 55 (older cells: not recorded).",
        "",
        "| CoRP cells | cells | deployed | deployed, worse on test | kept the base | kept, candidate better "
        "on test (cost) | kept, candidate worse on test (saved) | kept, tied | kept, candidate's test not recorded |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_row(label, [c for c in cells if c["label"] == label], base) for label in labels]
    if len(labels) > 1:
        lines.append(_row("all", cells, base))
    return lines + [""]
