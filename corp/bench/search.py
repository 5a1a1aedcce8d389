"""The bench's hyperparameter search (`hyperparameters: search`): the same number of trials for every
method, compared on the validation split, never on test.

Protocol (the issue's "each method gets the same number of trials, chosen on the validation split"):
- a method names a grid in its config entry, `search: {option: [values, ...]}`; its trials are
  `trials` distinct points of that grid, drawn by a fixed seed (the whole grid is never tried when
  it is larger, so a method with a bigger grid gets no more chances than one with a smaller one;
  a grid smaller than `trials` is refused, so no method gets fewer);
- every trial is a bench cell of its own (setting "tune"), run on the first seed with the paper
  data setting and `report_on: validation`: the rows it reports are computed on the validation
  split, and the test split is not evaluated at all;
- per (task, method variant, budget) the trial with the best validation accuracy (the mean over
  the method's rows, e.g. RandOpt's top-1 and K-vote; ties go to the earlier trial) is chosen, and
  its options are used for every seed and both data settings;
- the third edition's fields move the trials (corp.bench.config): `tune_setting` (the final data
  setting's split sizes), `tune_split` (a development split: `dev`), `tune_seeds` (a trial is then
  one cell per seed, scored by its mean over them) and `tune_options`; the defaults are the above;
- a method without a search space runs with its options as given (the results say 0 trials).

In the equal-data setting the validation examples are also training data of RandOpt, ES and GRPO;
the choice made in the paper setting, where they are not, is reused there.
"""

from __future__ import annotations

import itertools
import random

from corp.errors import CorpError
from corp.grids import edge_flag


def grid(space: dict) -> list[dict]:
    """Every combination of a search space {option: [values]}, options in sorted order."""
    keys = sorted(space)
    return [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]


def trial_options(method: str, label: str, space: dict, trials: int) -> list[dict]:
    """`trials` distinct grid points, drawn by a seed fixed by the method and variant (the same on
    every task and in every rerun)."""
    points = grid(space)
    return random.Random(f"corp-bench-trials|{method}|{label}").sample(points, trials)


def check_search(cfg) -> None:
    """One error line for a search space the protocol cannot use (before any compute)."""
    spaces = {name: (spec or {}).get("search") for name, spec in cfg.methods.items()}
    spaces = {n: s for n, s in spaces.items() if s is not None}
    if cfg.hyperparameters != "search":
        if spaces:
            raise CorpError(
                f"bench config: method '{next(iter(spaces))}' has a search space but hyperparameters is "
                f"'{cfg.hyperparameters}'; set hyperparameters: search, or remove the search space"
            )
        return
    if cfg.trials < 1:
        raise CorpError(f"bench config: trials must be >= 1, got {cfg.trials}")
    if not spaces:
        raise CorpError(
            "bench config: hyperparameters: search, but no method has a search space (search: {option: [values]})"
        )
    for name, spec in cfg.methods.items():  # one trial count for every method: a per-method count must be the same
        own = (spec or {}).get("trials")
        if own is not None and own != cfg.trials:
            raise CorpError(
                f"bench config: method '{name}' asks for {own} trials, the others get trials = {cfg.trials}; "
                "every method gets the same number (remove its trials or set it to the same)"
            )
    for name, space in spaces.items():
        _check_space(cfg, name, space)


def _check_space(cfg, name: str, space) -> None:
    """`check_search` for one method's search space: a grid of non-empty lists, no option both fixed and
    searched, at least `trials` points."""
    if not isinstance(space, dict) or not space or any(not isinstance(v, list) or not v for v in space.values()):
        raise CorpError(f"bench config: method '{name}': search must map each option to a non-empty list of values")
    spec = cfg.methods[name] or {}
    fixed = set(spec.get("options") or {}) | {k for over in (spec.get("variants") or {}).values() for k in (over or {})}
    both = sorted(fixed & set(space))
    if both:
        raise CorpError(
            f"bench config: method '{name}': option '{both[0]}' is both fixed (options/variants) and searched; remove one"
        )
    n = len(grid(space))
    if n < cfg.trials:
        raise CorpError(
            f"bench config: method '{name}': its search space has {n} combination(s), fewer than trials = "
            f"{cfg.trials}; add values or lower trials (every method gets the same number)"
        )


def trial_score(record: dict) -> float | None:
    """A trial's validation accuracy: the mean over its own rows (None: it produced no row). RandOpt's
    rows on a CoRP trial's population (population_rows) are not CoRP's and do not score it."""
    accs = [
        r["accuracy"] for r in record.get("rows", []) if r.get("accuracy") is not None and not r.get("population_row")
    ]
    return sum(accs) / len(accs) if accs else None


def choose(records: list[dict]) -> int | None:
    """Index of the best trial by `trial_score` (ties: the earlier trial); None when no trial
    produced a row (every one was below the budget's minimum)."""
    best, best_score = None, None
    for i, rec in enumerate(records):
        score = trial_score(rec)
        if score is None:
            continue
        if best_score is None or score > best_score:
            best, best_score = i, score
    return best


def edge_flags(space: dict, chosen: dict) -> list[dict]:
    """Flags for the searched options whose chosen value is the smallest or largest of its grid (corp.grids):
    the best may lie beyond what the search tried."""
    found = (edge_flag(k, chosen[k], space[k]) for k in sorted(space) if k in chosen)
    return [f for f in found if f]
