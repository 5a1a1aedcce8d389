"""The bench's third-edition protocol (issue 39): pre-registered primary comparisons with Holm's
correction, the registration stored beside the cells, and the config checks of the tuning protocol.

- `primary` entries are parsed into {a, b, task, budget, setting} (`check_protocol`, at config
  validation); a comparison of the report is primary when its pair, task, setting and budget match
  one (`mark_primary`), and the primary family is corrected with `corp.algorithms.stats.holm` over every
  registered entry, run or not (a missing one counts in m and is never rejected).
- The registration (`registration`): the primary set, the named test set, a hash of every task's
  test example ids, each task's final seeds and the equivalence margins. A computing run stores it as
  RESULTS_DIR/NAME/preregistration.json while no final cell exists (trials may run before: they never
  touch test), and every later run, `--report-only` included, compares it: once a final cell exists,
  a change to any of them is refused in one line (`check_registration`), since a primary, a seed
  count or a margin chosen after seeing test outcomes is exploratory. A registration stored before
  seeds and margins were registered (bench-cpu-3's) is compared on the fields it holds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from corp.algorithms.stats import holm
from corp.bench.config import BENCH_PROTOCOL
from corp.errors import CorpError
from corp.evaluate.tasks import SplitSizes, get_task, make_splits
from corp.runtime.runs import write_json

HOLM_ALPHA = 0.05
REGISTRATION = "preregistration.json"


def key_of(c: dict, spec_of: dict) -> tuple:
    """A comparison's identity as a primary entry's: (a, b, task spec, budget, setting)."""
    return (c["a"], c["b"], spec_of.get(c["task"], c["task"]), c["budget"], c["setting"])


def mark_primary(cfg, comps: list[dict]) -> list[dict]:
    """Tag each comparison primary or not, and correct the primary family with Holm over every
    registered entry (a missing one counts). Returns one row per registered entry, in config order:
    the entry and its comparison (None: not run yet) with {p, p_holm, reject}."""

    spec_of = {cfg.label(t): t for t in cfg.tasks}
    found = {key_of(c, spec_of): c for c in comps}
    out = []
    for p in cfg.primary_list:
        c = found.get((p["a"], p["b"], p["task"], p["budget"], p["setting"]))
        if c is not None:
            c["primary"] = True
        out.append({"entry": p, "comparison": c})
    for c in comps:
        c.setdefault("primary", False)
    ps = [(r["comparison"] or {}).get("p") if (r["comparison"] or {}).get("n_seeds", 1) >= 2 else None for r in out]
    for r, h in zip(out, holm(ps, HOLM_ALPHA)):
        r.update(h)
        if r["comparison"] is not None:
            r["comparison"].update(p_holm=h["p_holm"], holm_reject=h["reject"])
    return out


# ----------------------------------------------------------------------------- registration


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def held_out_identity(cfg) -> dict:
    """Per task label, the test split's size and a hash of its example ids (in order)."""

    out = {}
    for task in cfg.tasks:
        sizes = SplitSizes(cfg.n_support, cfg.n_probe, cfg.n_validation, cfg.n_test)
        test = make_splits(get_task(task, cfg.data), sizes, cfg.split_seed)["test"]
        out[cfg.label(task)] = {"n": len(test), "ids_sha256": _sha([ex.id for ex in test])}
    return out


def registration(cfg) -> dict | None:
    """What is registered (None: the config registers nothing, an older bench)."""
    if not cfg.primary_list and not str(cfg.test_set).strip():
        return None
    primary = [{**p, "task": cfg.label(p["task"])} for p in cfg.primary_list]
    margins = [{**e, "task": e["task"] and cfg.label(e["task"])} for e in getattr(cfg, "equivalence_list", [])]
    reg = {
        "primary": primary,
        "test_set": str(cfg.test_set),
        "test_examples": held_out_identity(cfg),
        "seeds": {cfg.label(t): list(cfg.seeds_of(t)) for t in cfg.tasks},
        "equivalence": margins,
    }
    own = {n: spec["seeds"] for n, spec in cfg.methods.items() if (spec or {}).get("seeds")}
    if own:  # methods on some of the seeds only (an older registration has none, and keeps its hash)
        reg["method_seeds"] = own
    shares = {n: cfg.budget_share(n) for n in cfg.methods if cfg.budget_share(n) != 1.0}
    if shares:  # tuning charged to a method: what its finals may spend is part of what was registered
        reg["budget_share"] = shares
    return {"hash": _sha(reg), **reg}


def _as_stored(reg: dict, stored: dict) -> dict:
    """REG on the fields STORED registered, with their hash: an older registration (without seeds and
    margins) registered only what it holds, so only that can differ from it."""
    fields = {k: v for k, v in reg.items() if k != "hash" and k in stored}
    return {"hash": _sha(fields), **fields}


def final_records(out: Path) -> list[str]:
    """The final (non-trial) cell records of the current bench protocol in OUT/cells."""
    names = []
    for path in sorted((out / "cells").glob("*.json")) if (out / "cells").is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a damaged record is named by preflight.check_existing_results
        if rec.get("setting") != "tune" and rec.get("bench_protocol", 1) == BENCH_PROTOCOL:
            names.append(path.name)
    return names


def _differs(stored: dict | None, reg: dict | None) -> str:
    stored, reg = stored or {}, reg or {}
    what = [k.replace("_", " ") for k in stored if k != "hash" and stored[k] != reg.get(k)]
    return ", ".join(what) or "hash"


def check_registration(cfg, out: Path, compute: bool) -> dict | None:
    """Compare the config's registration with the stored one. Before any final cell exists a
    computing run (re)writes it; after, a difference is refused in one line. Returns the stored
    registration (None: nothing registered)."""

    reg = registration(cfg)
    path = out / REGISTRATION
    stored = json.loads(path.read_text()) if path.exists() else None
    if stored is None and reg is None:
        return None
    if stored is not None and reg is not None and stored.get("hash") == _as_stored(reg, stored)["hash"]:
        return stored
    finals = final_records(out)
    if finals:
        if stored is None:
            raise CorpError(
                f"bench {cfg.name}: primary comparisons and test set are registered before any final cell runs, and "
                f"{len(finals)} final cell(s) already exist in {out / 'cells'}; report these as exploratory (compare), "
                "or register them for a bench under a new name"
            )
        raise CorpError(
            f"bench {cfg.name}: the config's pre-registration differs from {path} ({_differs(stored, reg)}) and "
            f"{len(finals)} final cell(s) exist; restore what is registered there (primary, test_set, seeds, "
            "equivalence), or start a bench under a new name"
        )
    if compute:
        if reg is None:
            path.unlink()  # corp wrote it, before any final cell: the config no longer registers anything
            return None
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, reg)
        return reg
    return stored
