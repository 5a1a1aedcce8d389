"""The bench's third-edition protocol (issue 39): pre-registered primary comparisons with Holm's
correction, the registration stored beside the cells, and the config checks of the tuning protocol.

- `primary` entries are parsed into {a, b, task, budget, setting} (`check_protocol`, at config
  validation); a comparison of the report is primary when its pair, task, setting and budget match
  one (`mark_primary`), and the primary family is corrected with `corp.stats.holm` over every
  registered entry, run or not (a missing one counts in m and is never rejected).
- The registration (`registration`): the primary set, the named test set and a hash of every task's
  test example ids. A computing run stores it as RESULTS_DIR/NAME/preregistration.json while no
  final cell exists (trials may run before: they never touch test), and every later run, `--report-only`
  included, compares it: once a final cell exists, a different primary set or test set is refused in
  one line (`check_registration`), since a primary chosen after seeing test outcomes is exploratory.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from corp import CorpError
from corp.bench.config import BENCH_PROTOCOL, MAX_PRIMARY, SETTINGS

_PRIMARY = re.compile(r"^\s*(\S+)\s+vs\s+(\S+)\s*@\s*(\S+)\s+on\s+(\S+?)(?:\s+in\s+(\S+))?\s*$")
HOLM_ALPHA = 0.05
REGISTRATION = "preregistration.json"


def _budget(value, budgets: list[float], where: str) -> float:
    if str(value).strip().lower() == "top":
        return max(budgets)
    try:
        b = float(value)
    except (TypeError, ValueError):
        raise CorpError(f"bench config: {where}: budget '{value}' is not a number or `top`") from None
    hit = [x for x in budgets if math.isclose(x, b, rel_tol=1e-9)]
    if not hit:
        raise CorpError(
            f"bench config: {where}: budget {b:.3g} is not one of budgets ({', '.join(f'{x:.3g}' for x in budgets)})"
        )
    return hit[0]


def parse_primary(cfg, entry) -> dict:
    """One primary entry as {a, b, task (spec), budget, setting}; one error line for a bad one."""
    where = f"primary {entry!r}"
    if isinstance(entry, str):
        m = _PRIMARY.match(entry)
        if not m:
            raise CorpError(f"bench config: {where}: write it as 'A vs B @ BUDGET on TASK [in SETTING]'")
        a, b, budget, task, setting = m.groups()
    elif isinstance(entry, dict) and not set(entry) - {"a", "b", "budget", "task", "setting"}:
        a, b, budget, task, setting = (entry.get(k) for k in ("a", "b", "budget", "task", "setting"))
        if not (a and b and budget is not None and task):
            raise CorpError(f"bench config: {where}: needs a, b, budget and task")
    else:
        raise CorpError(f"bench config: {where}: give 'A vs B @ BUDGET on TASK' or {{a, b, budget, task, setting}}")
    by_label = {cfg.label(t): t for t in cfg.tasks}
    spec = by_label.get(str(task), str(task))
    if spec not in cfg.tasks:
        raise CorpError(f"bench config: {where}: task '{task}' is not a task of the bench ({', '.join(by_label)})")
    headline = "equal-data" if "equal-data" in cfg.settings else cfg.settings[0]
    setting = str(setting or headline)
    if setting not in cfg.settings:
        raise CorpError(
            f"bench config: {where}: setting '{setting}' is not one of settings ({', '.join(cfg.settings)})"
        )
    return {"a": str(a), "b": str(b), "task": spec, "budget": _budget(budget, cfg.budgets, where), "setting": setting}


def check_protocol(cfg) -> None:
    """The third edition's fields, checked before compute (each absent from an older config)."""
    if not isinstance(cfg.primary, list):
        raise CorpError("bench config: primary must be a list of 'A vs B @ BUDGET on TASK' entries")
    if len(cfg.primary) > MAX_PRIMARY:
        raise CorpError(
            f"bench config: {len(cfg.primary)} primary comparisons; pre-register at most {MAX_PRIMARY} "
            "(move the others to compare, which the report shows as exploratory)"
        )
    cfg.primary_list = [parse_primary(cfg, e) for e in cfg.primary]
    keys = [(p["a"], p["b"], p["task"], p["budget"], p["setting"]) for p in cfg.primary_list]
    if len(set(keys)) != len(keys):
        raise CorpError("bench config: primary names one comparison twice; give each once")
    if cfg.primary_list and not str(cfg.test_set).strip():
        raise CorpError(
            "bench config: primary comparisons are registered with the test set they run on; "
            "name it in test_set (e.g. the split edition)"
        )
    fewest = min((len(cfg.seeds_of(p["task"])) for p in cfg.primary_list), default=2)
    if fewest < 2:
        raise CorpError(f"bench config: primary comparisons need at least 2 seeds per task, got {fewest}")
    defaults = {"tune_setting": "paper", "tune_split": "validation", "tune_seeds": 1, "tune_options": {}}
    if cfg.hyperparameters != "search":
        changed = [k for k, v in defaults.items() if getattr(cfg, k) != v]
        if changed:
            raise CorpError(f"bench config: {changed[0]} applies under hyperparameters: search only; remove it")
    if cfg.tune_setting not in SETTINGS:
        raise CorpError(f"bench config: tune_setting '{cfg.tune_setting}' is not one of {', '.join(SETTINGS)}")
    if cfg.tune_split == "test":
        raise CorpError("bench config: tune_split is test; trials never look at test (use validation or a dev split)")
    if cfg.tune_setting == "equal-data" and cfg.tune_split == "validation":
        raise CorpError(
            "bench config: tune_setting equal-data with tune_split validation: in equal data RandOpt, ES and GRPO "
            "train on the validation examples; score trials on a split of their own (tune_split: dev)"
        )
    if not (isinstance(cfg.tune_seeds, int) and 1 <= cfg.tune_seeds <= len(cfg.seeds)):
        raise CorpError(
            f"bench config: tune_seeds must be 1 to {len(cfg.seeds)} (the bench's seeds), got {cfg.tune_seeds}"
        )
    if not isinstance(cfg.tune_options, dict):
        raise CorpError("bench config: tune_options must map option names to values")
    for entry in cfg.ratio_compare:
        ok = isinstance(entry, dict) and {"a", "b"} <= set(entry) <= {"a", "b", "ratio"}
        ratio = entry.get("ratio", 10) if ok else None
        if not ok or not isinstance(ratio, (int, float)) or not ratio > 1:
            raise CorpError(f"bench config: ratio_compare entries are {{a: ROW, b: ROW, ratio: R > 1}}, got {entry!r}")
    for name, target in (cfg.regime_targets or {}).items():
        if not isinstance(target, dict) or any(not isinstance(v, (int, float)) for v in target.values()):
            raise CorpError(f"bench config: regime_targets of '{name}' must map units/options to numbers")


def key_of(c: dict, spec_of: dict) -> tuple:
    """A comparison's identity as a primary entry's: (a, b, task spec, budget, setting)."""
    return (c["a"], c["b"], spec_of.get(c["task"], c["task"]), c["budget"], c["setting"])


def mark_primary(cfg, comps: list[dict]) -> list[dict]:
    """Tag each comparison primary or not, and correct the primary family with Holm over every
    registered entry (a missing one counts). Returns one row per registered entry, in config order:
    the entry and its comparison (None: not run yet) with {p, p_holm, reject}."""
    from corp.stats import holm

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
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits

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
    reg = {"primary": primary, "test_set": str(cfg.test_set), "test_examples": held_out_identity(cfg)}
    return {"hash": _sha(reg), **reg}


def final_records(out: Path) -> list[str]:
    """The final (non-trial) cell records of the current bench protocol in OUT/cells."""
    names = []
    for path in sorted((out / "cells").glob("*.json")) if (out / "cells").is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a damaged record is named by check_results_dir
        if rec.get("setting") != "tune" and rec.get("bench_protocol", 1) == BENCH_PROTOCOL:
            names.append(path.name)
    return names


def _differs(stored: dict | None, reg: dict | None) -> str:
    stored, reg = stored or {}, reg or {}
    what = [k.replace("_", " ") for k in ("primary", "test_set", "test_examples") if stored.get(k) != reg.get(k)]
    return ", ".join(what) or "hash"


def check_registration(cfg, out: Path, compute: bool) -> dict | None:
    """Compare the config's registration with the stored one. Before any final cell exists a
    computing run (re)writes it; after, a difference is refused in one line. Returns the stored
    registration (None: nothing registered)."""
    from corp.runs import write_json

    reg = registration(cfg)
    path = out / REGISTRATION
    stored = json.loads(path.read_text()) if path.exists() else None
    if stored is None and reg is None:
        return None
    if stored is not None and reg is not None and stored.get("hash") == reg["hash"]:
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
            f"{len(finals)} final cell(s) exist; restore primary/test_set as registered there, or start a bench "
            "under a new name"
        )
    if compute:
        if reg is None:
            path.unlink()  # corp wrote it, before any final cell: the config no longer registers anything
            return None
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, reg)
        return reg
    return stored
