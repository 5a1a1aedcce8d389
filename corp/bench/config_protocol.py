"""The bench config's protocol fields (the third edition's, issue 39, and later ones), checked before compute:
`primary` and `test_set` (the pre-registration), the tuning fields, `ratio_compare`, retention, `equivalence`
and `regime_targets`. Each is absent from an older config; `BenchConfig.validate` calls `check_protocol`
(with the data settings it knows: this module imports nothing of corp.bench.config)."""

from __future__ import annotations

import math
import re

from corp.config import parse_list
from corp.errors import CorpError
from corp.evaluate.retention import DEFAULT_TEXT, parse_texts, texts_of

MAX_PRIMARY = 6  # the "at most about 6": a larger family mostly buys a stricter correction

_PRIMARY = re.compile(r"^\s*(\S+)\s+vs\s+(\S+)\s*@\s*(\S+)\s+on\s+(\S+?)(?:\s+in\s+(\S+))?\s*$")


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


def check_protocol(cfg, settings: tuple[str, ...]) -> None:
    """The third edition's fields, checked before compute (each absent from an older config)."""
    _check_primary(cfg)
    _check_tuning(cfg, settings)
    for entry in cfg.ratio_compare:
        ok = isinstance(entry, dict) and {"a", "b"} <= set(entry) <= {"a", "b", "ratio"}
        ratio = entry.get("ratio", 10) if ok else None
        if not ok or not isinstance(ratio, (int, float)) or not ratio > 1:
            raise CorpError(f"bench config: ratio_compare entries are {{a: ROW, b: ROW, ratio: R > 1}}, got {entry!r}")
    if not isinstance(cfg.retention, bool):
        raise CorpError(f"bench config: retention is true or false, got {cfg.retention!r}")
    cfg.retention_tasks = parse_list(cfg.retention_tasks, str, "retention_tasks")
    if cfg.retention_tasks and not cfg.retention:
        raise CorpError("bench config: retention_tasks applies with retention: true; add it or remove retention_tasks")
    cfg.retention_texts = parse_texts(cfg.retention_texts)
    if cfg.retention_texts != [DEFAULT_TEXT] and not cfg.retention:
        raise CorpError("bench config: retention_texts applies with retention: true; add it or remove retention_texts")
    if cfg.retention:
        texts_of(cfg.retention_texts)  # missing or another edition: one line now, not after the cells ran
    cfg.equivalence_list = [parse_equivalence(cfg, e) for e in (cfg.equivalence or [])]
    for name, target in (cfg.regime_targets or {}).items():
        if not isinstance(target, dict) or any(not isinstance(v, (int, float)) for v in target.values()):
            raise CorpError(f"bench config: regime_targets of '{name}' must map units/options to numbers")


def _check_primary(cfg) -> None:
    """primary: at most MAX_PRIMARY distinct comparisons, with a named test set and 2 seeds per task."""
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


def _check_tuning(cfg, settings: tuple[str, ...]) -> None:
    """tune_*: only under hyperparameters: search, never on test, on seeds the bench has."""
    defaults = {"tune_setting": "paper", "tune_split": "validation", "tune_seeds": 1, "tune_options": {}}
    if cfg.hyperparameters != "search":
        changed = [k for k, v in defaults.items() if getattr(cfg, k) != v]
        if changed:
            raise CorpError(f"bench config: {changed[0]} applies under hyperparameters: search only; remove it")
    if cfg.tune_setting not in settings:
        raise CorpError(f"bench config: tune_setting '{cfg.tune_setting}' is not one of {', '.join(settings)}")
    if cfg.tune_split == "test":
        raise CorpError("bench config: tune_split is test; trials never look at test (use validation or a dev split)")
    if cfg.tune_setting == "equal-data" and cfg.tune_split == "validation":
        raise CorpError(
            "bench config: tune_setting equal-data with tune_split validation: in equal data RandOpt, ES and GRPO "
            "train on the validation examples; score trials on a split of their own (tune_split: dev)"
        )
    _check_tune_seeds(cfg)
    if not isinstance(cfg.tune_options, dict):
        raise CorpError("bench config: tune_options must map option names to values")


def _check_tune_seeds(cfg) -> None:
    """tune_seeds: a list of seeds of their own (none a final seed), or a count of the bench's first seeds."""
    if isinstance(cfg.tune_seeds, list):
        if not cfg.tune_seeds or len(set(cfg.tune_seeds)) < len(cfg.tune_seeds) or min(cfg.tune_seeds) < 0:
            raise CorpError(
                f"bench config: tune_seeds {cfg.tune_seeds} must be distinct seeds >= 0 (a list), or a count of "
                "the bench's first seeds"
            )
        if both := sorted(set(cfg.tune_seeds) & set(cfg.seeds)):
            raise CorpError(
                f"bench config: tune_seeds {cfg.tune_seeds} names final seed(s) {both}: a list names seeds of their "
                "own (e.g. [100, 101]); for the first N of seeds write the number N in the config"
            )
    elif not 1 <= cfg.tune_seeds <= len(cfg.seeds):
        raise CorpError(
            f"bench config: tune_seeds must be 1 to {len(cfg.seeds)} (the bench's first seeds) or a list of "
            f"seeds, got {cfg.tune_seeds}"
        )


def parse_equivalence(cfg, entry) -> dict:
    """One `equivalence` entry as {a, b, margin, task (spec or None), budget (or None), setting (or None)}."""
    keys = {"a", "b", "margin", "task", "budget", "setting"}
    ok = isinstance(entry, dict) and {"a", "b", "margin"} <= set(entry) <= keys
    margin = entry.get("margin") if ok else None
    if not ok or isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < 1:
        raise CorpError(
            f"bench config: equivalence entries are {{a: ROW, b: ROW, margin: M}} with 0 < M < 1 (an accuracy "
            f"difference; optional task, budget, setting), got {entry!r}"
        )
    where = f"equivalence {entry!r}"
    task = entry.get("task")
    if task is not None:
        by_label = {cfg.label(t): t for t in cfg.tasks}
        task = by_label.get(str(task), str(task))
        if task not in cfg.tasks:
            raise CorpError(f"bench config: {where}: task '{entry['task']}' is not a task of the bench")
    budget = entry.get("budget")
    if budget is not None:
        budget = _budget(budget, cfg.budgets, where)
    setting = entry.get("setting")
    if setting is not None and setting not in cfg.settings:
        raise CorpError(f"bench config: {where}: setting '{setting}' is not one of settings")
    return {
        "a": str(entry["a"]),
        "b": str(entry["b"]),
        "margin": float(margin),
        "task": task,
        "budget": budget,
        "setting": setting,
    }
