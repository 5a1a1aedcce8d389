"""Noise scales chosen from the model (`--sigmas auto`, the default; issue 55).

A fixed grid does not fit every model: on SmolLM2-135M, sigma = 5e-4 leaves most specialists answering
exactly as the base does, so a third of a paper-grid population is spent on copies of the base, while on a
larger model the same sigma may already break it. What matters is how far a noise scale moves the model's
*behaviour*, so the scale is read off that directly:

The rule (`RULE`): take the first `prompts` prompts of the support split (their labels are not used) and
the base's greedy completions at the run's generation length. For a noise scale sigma, draw `specialists`
calibration specialists (seeds derived from the master seed under their own label, so they are not the
population's) and measure the share of (specialist, prompt) pairs whose completion differs from the
base's. Starting at `start`, double sigma while the share is below `target` (halve it while it is at or
above), at most `levels` scales and within `bounds`, until two neighbouring scales bracket the target;
sigma* is the log-linear interpolation between them, and the grid is [sigma*/2, sigma*, 2 sigma*]
(two significant digits, so it prints and keys cleanly): specialists that change some answers, not
copies of the base nor noise. A search that never brackets the target uses the bound it reached, says
so in one line and is flagged as a grid edge (corp.grids).

The same calibration specialists are used at every scale (their noise only grows), so the share
rises with sigma up to sampling noise. Generation length: the run's own (`--max-completion-length`),
not a shorter one: the Ray executor's workers generate at the run's length (a row's key holds it),
and a specialist identical to the base over the whole completion is what wastes a population slot.

The calibration is scored through the run's executor (hf, vLLM, Ray alike) into `calibration.jsonl`
(rows keyed like every evaluation, so a rerun generates nothing), its outcome goes to
`calibration.json`, and its ledger is charged to the population (`selection_ledger` in
corp.evaluate.scorer).

ES (`corp es --sigma auto`, its default) runs the same calibration before its first iteration and takes
sigma* itself as its one noise scale (not the grid); its ledger is charged to ES's training ledger
(corp.methods.es). The lines below then name `--sigma` (`option="sigma"`) instead of `--sigmas`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from corp.algorithms.perturb.noise import derive_seeds
from corp.config import flag
from corp.errors import CorpError
from corp.grids import edge_flag
from corp.runtime.context import EvalCache, RunContext
from corp.runtime.runs import write_json

CALIBRATION_ROWS = "calibration.jsonl"
CALIBRATION_FILE = "calibration.json"
SPLIT = "calibration"  # the run's first support prompts, under their own split name while calibrating
RULE = {
    "version": "corp-sigma-calibration-v1",
    "measure": "share of (specialist, prompt) pairs whose greedy completion differs from the base's",
    "target": 0.5,
    "prompts": 8,
    "specialists": 3,
    "start": 1e-3,
    "bounds": [1e-5, 0.1],
    "levels": 8,
}


def is_auto(sigmas) -> bool:
    """Whether a config's `sigmas` asks for calibration (`auto`) rather than naming the scales."""
    return isinstance(sigmas, str) and sigmas.strip().lower() == "auto"


def calibration_seeds(master_seed: int, n: int) -> list[int]:
    """The calibration specialists' seeds: derived from the master seed under a label of their own, so they
    are not the population's (`corp-specialist`) seeds."""
    return derive_seeds("corp-calibration", master_seed, n=n)


def two_digits(x: float) -> float:
    return float(f"{x:.2g}")


def changed_share(base: dict, rows: list[dict]) -> float:
    """Share of (specialist, prompt) pairs whose completion differs from the base's (rows' completion hashes)."""
    if any("completion_hashes" not in r for r in [base, *rows]):
        raise CorpError(f"{CALIBRATION_ROWS} holds rows written by an older corp; remove it and rerun")
    pairs = [(a, b) for r in rows for a, b in zip(r["completion_hashes"], base["completion_hashes"])]
    return sum(a != b for a, b in pairs) / len(pairs)


def _bracket(levels: list[dict], target: float) -> tuple[dict, dict] | None:
    """The last two scales measured when they lie on either side of the target, lower scale first."""
    if len(levels) < 2:
        return None
    a, b = sorted(levels[-2:], key=lambda v: v["sigma"])
    return (a, b) if a["share"] < target <= b["share"] else None


def search(measure: Callable[[float], float], rule: dict = RULE) -> dict:
    """The scale search of the module docstring on `measure(sigma) -> share`: {sigma, levels, bracket, edge}."""
    lo, hi = rule["bounds"]
    target, sigma, levels = rule["target"], float(rule["start"]), []
    while True:
        levels.append({"sigma": sigma, "share": measure(sigma)})
        pair = _bracket(levels, target)
        if pair is not None:
            a, b = pair
            t = (target - a["share"]) / (b["share"] - a["share"])
            star = math.exp(math.log(a["sigma"]) + t * (math.log(b["sigma"]) - math.log(a["sigma"])))
            return {"sigma": two_digits(star), "levels": levels, "bracket": [a, b], "edge": None}
        up = levels[-1]["share"] < target
        nxt = min(sigma * 2, hi) if up else max(sigma / 2, lo)
        if nxt == sigma or len(levels) >= rule["levels"]:  # at a bound, or out of levels: no bracket
            return {"sigma": two_digits(sigma), "levels": levels, "bracket": None, "edge": "max" if up else "min"}
        sigma = nxt


def grid_of(sigma: float) -> list[float]:
    return [two_digits(sigma / 2), two_digits(sigma), two_digits(sigma * 2)]


def calibrate_sigmas(ctx: RunContext, score: Callable, option: str = "sigmas") -> dict:
    """Calibrate the noise scales of `ctx`'s population (module docstring) with `score`
    (corp.evaluate.scorer.score_specialists); write calibration.json and return what it holds. `option`: the
    config field the calibration stands in for (`sigmas`, a population's grid; `sigma`, ES's one scale), as
    the warning of a search that never brackets its target names it."""
    rule = RULE
    cache = EvalCache(ctx.run_dir / CALIBRATION_ROWS)
    seeds = calibration_seeds(ctx.cfg.seed, rule["specialists"])
    ctx.splits[SPLIT] = list(ctx.splits["support"][: rule["prompts"]])
    used: list[dict] = []
    try:
        base = score(ctx, [(None, None)], SPLIT, cache, desc="calibration (base)")[(None, None)]
        used.append(base)

        def measure(sigma: float) -> float:
            rows = list(
                score(ctx, [(s, sigma) for s in seeds], SPLIT, cache, desc=f"calibration sigma={sigma:g}").values()
            )
            used.extend(rows)
            return changed_share(base, rows)

        found = search(measure, rule)
        ids = ctx.example_ids(SPLIT)
    finally:
        ctx.splits.pop(SPLIT, None)
    led = ctx.ledger().add_rows(used)
    out = {
        "rule": rule,
        "sigmas": grid_of(found["sigma"]),
        **found,
        "seeds": seeds,
        "example_ids": ids,
        "generations": sum(r["n_examples"] * r["n"] for r in used),
        "ledger": led.to_dict(),
    }
    write_json(ctx.run_dir / CALIBRATION_FILE, out)
    if found["edge"]:
        warnings.warn(calibration_line(out, option), stacklevel=2)
    return out


def charge(ledger, cal: dict):
    """`ledger` with a calibration's generations (calibration.json's own ledger) added: what choosing the noise
    scales cost, charged to whatever reads them (a population's selection, ES's training)."""
    return ledger.add_generation(cal["ledger"]["prompt_tokens"], cal["ledger"]["generated_tokens"])


def calibration_flag(cal: dict | None, option: str = "sigmas") -> dict | None:
    """report.json's edge flag when the calibration never bracketed its target (it used a bound); `option`:
    the field that fixes the scales instead (`sigmas`, or ES's `sigma`)."""
    if not cal or not cal.get("edge"):
        return None
    return edge_flag("calibrated sigma", cal["sigma"], cal["rule"]["bounds"], flag(option))


def calibration_line(cal: dict, option: str = "sigmas") -> str:
    """One line: the calibrated grid (`option` "sigma": ES's one scale, sigma*), what it was read from and
    what it cost."""
    target = cal["rule"]["target"]
    if option == "sigma":
        what, fix = f"noise scale calibrated from the model: {cal['sigma']:g}", "--sigma to choose the scale"
    else:
        grid = ", ".join(f"{s:g}" for s in cal["sigmas"])
        what, fix = f"noise scales calibrated from the model: {grid}", "--sigmas to choose the scales"
    cost = f"cost {cal['generations']} generations ({cal['ledger']['flops']:.3g} FLOPs)"
    if cal.get("bracket"):
        a, b = cal["bracket"]
        return (
            f"{what} (share of changed completions {target:g} at sigma "
            f"{cal['sigma']:g}, between {a['share']:.2f} at {a['sigma']:g} and {b['share']:.2f} at {b['sigma']:g}), "
            f"{cost}"
        )
    last = cal["levels"][-1]
    lo, hi = cal["rule"]["bounds"]
    return (
        f"{what}, but the share of changed completions never reached "
        f"{target:g} within sigma [{lo:g}, {hi:g}] in {len(cal['levels'])} scales ({last['share']:.2f} at "
        f"{last['sigma']:g}), so sigma {cal['sigma']:g} is an edge: pass {fix}; {cost}"
    )


def scale_line(sigma: float, cal: dict | None) -> str:
    """What an ES report and its model card say about its one noise scale: calibrated from the model (`cal`,
    calibration.json), or fixed by --sigma."""
    return calibration_line(cal, "sigma") if cal else f"noise scale fixed by --sigma: {float(sigma):g}"


def noise_line(source: dict | None) -> str:
    """What a report and a model card say about the population's noise scales (its `population.source`)."""
    src = source or {}
    if src.get("calibration"):
        line = calibration_line(src["calibration"])
        return line if src.get("rule") == "scored in this run" else f"{line} (in --from-run {src['from']})"
    scales = src.get("from_sigmas") or src.get("sigmas")
    if not scales:
        return ""
    shown = ", ".join(f"{float(s):g}" for s in scales)
    option = "--from-sigmas" if src.get("from_sigmas") else "--sigmas"
    where = "" if src.get("rule") == "scored in this run" else f" (in --from-run {src['from']})"
    return f"noise scales fixed by {option}: {shown}{where}"
