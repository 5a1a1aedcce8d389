"""What defines the rows written into a run directory (`population_definition`), and the check that
refuses to reuse a directory written under another definition (`check_meta`, `compare_meta`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from corp.algorithms.perturb import scheme_from_flag
from corp.config import PopulationConfig, RunConfig
from corp.errors import CorpError
from corp.evaluate.rewards import reward_identity
from corp.runtime.runs import read_json, write_json

POPULATION_FILE = "population.jsonl"


META_FILE = "population_meta.json"


META_FORMAT = 2


POPULATION_ORDER = "specialist i = (specialist_seeds(seed)[i], sigmas[i % len(sigmas)])"
# sigmas "auto": the grid is `calibrated_sigmas` (calibration.json says how it was chosen)


def run_scheme(cfg) -> str:
    """The noise scheme a config's `--noise` names (the current full-rank scheme without one)."""
    return scheme_from_flag(getattr(cfg, "noise", None))


def population_definition(cfg: RunConfig, task, splits, max_new_tokens: int, kind: str = "population", **more) -> dict:
    """What defines the rows of a population, as far as the config tells (the model's weights hash
    and id are added once it is loaded)."""
    return {
        "format": META_FORMAT,
        "kind": kind,  # population (RandOpt/CoRP: noise around the base) | es (noise around a moving centre)
        "model_name": cfg.model,
        "task": task.signature(),
        "reward": reward_identity(cfg.reward),
        "split": "support",
        "example_ids": [e.id for e in splits["support"]],
        "max_new_tokens": max_new_tokens,
        "noise_scheme": run_scheme(cfg),
        "param_filter": {"include": getattr(cfg, "include", ".*"), "exclude": getattr(cfg, "exclude", "")},
        "seed": cfg.seed,
        **more,
    }


def default_definition(cfg: RunConfig, task, splits, max_new_tokens: int) -> dict | None:
    if isinstance(cfg, PopulationConfig) and not cfg.from_run:
        # "auto": scales calibrated from the model (corp.evaluate.calibration); the grid it chose is added to the
        # meta as `calibrated_sigmas` once measured, so a rerun that calibrates otherwise is refused, not mixed
        sigmas = "auto" if isinstance(cfg.sigmas, str) else [float(s) for s in cfg.sigmas]
        return population_definition(cfg, task, splits, max_new_tokens, sigmas=sigmas, order=POPULATION_ORDER)
    return None


def compare_meta(
    found: dict,
    expected: dict,
    where: Path,
    what: str,
    keys: Sequence[str] | None = None,
    drawn: dict | None = None,
) -> None:
    """Refuse when `found` (a stored meta) disagrees with `expected` on any of `keys` (default: all of expected).
    `drawn`: the splits.json this run writes (split seed, ids per split), to say why the examples differ."""
    for key in keys if keys is not None else expected:
        if key not in expected:
            continue
        value = expected[key]
        if found.get(key) != value:
            if key == "example_ids":
                raise CorpError(_other_examples(found.get(key) or [], value, where, what, drawn))
            shown, was = value, found.get(key)
            raise CorpError(
                f"{what} in '{where}' was made with {key} = {was}, not "
                f"{shown}; use another --output-dir (or matching options)"
            )


def _split_settings(splits: dict) -> dict:
    """What draws a run's examples, from a splits.json: the split seed and each split's size."""
    return {"split_seed": splits.get("split_seed"), **{k: len(v) for k, v in splits.items() if isinstance(v, list)}}


def _other_examples(was: list, now: list, where: Path, what: str, drawn: dict | None = None) -> str:
    """The rows were scored on other support examples. Where the run's splits.json (read before it is
    rewritten) has this run's split seed and sizes (`drawn`), no option is to blame: the same settings drew
    other examples. Otherwise the split seed or a split size differs: names the option and the run's values."""
    try:
        stored = read_json(Path(where) / "splits.json")
    except (CorpError, OSError):
        stored = None
    if isinstance(stored, dict) and drawn is not None and _split_settings(stored) == _split_settings(drawn):
        return (
            f"{what} in '{where}' was scored on other support examples than this run's, though its split seed "
            f"{stored.get('split_seed')} and sizes are this run's: the examples differ (an older corp made it and "
            "drew its splits differently, or its data changed); use another --output-dir (output_dir= in Python)"
        )
    if isinstance(stored, dict) and "split_seed" in stored:
        sizes = [f"--n-{k} {len(stored[k])}" for k in ("support", "test") if isinstance(stored.get(k), list)]
        given = " ".join([f"--split-seed {stored['split_seed']}", *sizes])
        fix = f"resume it with {given} (split_seed=, n_support=, ... in Python)"
    else:
        fix = "resume it with the split_seed and split sizes its config.yaml records"
    return (
        f"{what} in '{where}' was scored on other support examples ({len(was)} ids) than this run's ({len(now)}): "
        f"--split-seed (split_seed in Python) or a split size differs from its run's; {fix}, or use another "
        "--output-dir"
    )


def check_meta(path: Path, expected: dict, what: str) -> None:
    """Refuse to reuse rows written under a different definition; write the meta if there is none."""
    if not path.exists():
        write_json(path, expected)
        return
    found = read_json(path)
    if found.get("format") != expected.get("format"):
        raise CorpError(
            f"{what} in '{path.parent}' was written by an older corp "
            "(rows not keyed by their examples); use another --output-dir"
        )
    compare_meta(found, expected, path.parent, what)
