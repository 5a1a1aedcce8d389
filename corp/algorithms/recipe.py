"""Recipes: a post-trained model as a few kilobytes of JSON (docs/architecture.md, "Direction and recipe").

The one reader and writer of recipes, for every method that ends in a weight-space direction.
A recipe names its `format` and its `kind`, the base model twice (`base_model`: the alias or name
the run was given, e.g. `smollm2-135m`; `base_model_id`: what that resolved to, e.g. a hub id) and
the sha256 of the base weights, the noise-scheme version, the parameter filter, the direction's
(seed, sigma, coef) components, and how it was made (`made_by`). `apply_recipe` rebuilds the model
bit-exactly from the base under the recipe's noise scheme (older schemes still generate), and
refuses other base weights or a scheme this corp cannot generate, since the same seeds would then
mean different weights.

Kinds (`RECIPE_KINDS`; a new method adds one with `register_kind`):
- `corp-direction`: CoRP consolidation (`corp consolidate`), seed components.
- `es`: the final ES centre (`corp es`), seed components in the order they were added.
- `low-rank`: CoRP with `--low-rank` (ours): no components; its `low_rank` entry names the factors
  file beside recipe.json (unit-scale B, A per matrix), its sha256, the scale and the ranks, and
  the model is rebuilt as scale * B @ A through the same Perturber path, so bit-exact too. A
  missing or altered factors file is an error.

Older recipes are read too: `corp-recipe-v1` (no `kind`: low-rank when it has a factors entry,
else `es` or `corp-direction` by `made_by.method`) and the first ES recipes, which had no `format`
and named the base by hub id only (e.g. results/baselines-smollm2-arith/es-recipe.json).

What a recipe must rebuild: `model_weights_hash`, the sha256 (`corp.algorithms.perturb.weights_hash`) of the
weights the run evaluated and saved (base + direction, in `model_dtype`), taken when the recipe is
written. `apply_recipe` checks every number of the recipe first (`check_numbers`: seeds are
integers, sigmas finite and in (0, MAX_SIGMA], coefficients and scales finite and at most
MAX_COEF in size), rebuilds, checks that every rebuilt tensor is finite, and compares the rebuilt
weights' hash with `model_weights_hash`: a recipe edited since it was evaluated no longer rebuilds
the evaluated model and is refused unless the user passes `allow_mismatch` (`--allow-mismatch`).
A recipe written before the hash existed is rebuilt with a warning that it cannot be checked.
`apply_recipe` never writes inside a run directory (the model a run saved there belongs to its
recipe and report).

Which base `apply_recipe` loads: `--model` when given; otherwise the recipe's `base_model` (what
the user typed, usually an alias that works offline), then any alias whose model is the recipe's
`base_model_id`, then that id, the first one available on this machine without a download. The
weights hash decides whether it was the right one.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

from corp.algorithms.lowrank import LowRankDirection, load_factors
from corp.algorithms.perturb import SCHEME_VERSION, Direction, ParamFilter, Perturber, check_scheme, weights_hash
from corp.cards import apply_card_text
from corp.errors import CorpError
from corp.runtime.models import (
    ALIASES,
    CARD_FILE,
    EmbeddedGGUF,
    check_output_dir,
    load_model,
    model_caches,
    resolve_model,
    save_model,
)
from corp.runtime.runs import enclosing_run_dir, read_json, write_json

RECIPE_FORMAT = "corp-recipe-v2"
# sanity bounds, far outside anything corp writes (sigmas ~1e-3, coefficients ~1e-2..1e2): a value
# beyond them is an edit or a corruption, and would write a model of overflowed or garbage weights
MAX_SIGMA = 10.0
MAX_COEF = 1e6
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
OLD_FORMATS = ("corp-recipe-v1",)

# kind -> builder(recipe, directory holding recipe.json) -> the direction to apply to the base
RECIPE_KINDS: dict[str, Callable[[dict, Path], Direction]] = {}


def register_kind(kind: str, build: Callable[[dict, Path], Direction]) -> None:
    RECIPE_KINDS[kind] = build


def _seed_direction(recipe: dict, where: Path) -> Direction:
    try:
        return Direction.from_json(recipe["components"])
    except (KeyError, TypeError, ValueError):
        raise CorpError(f"recipe in '{where}': its components are not a list of {{seed, sigma, coef}}") from None


def _low_rank_direction(recipe: dict, where: Path) -> Direction:

    if not isinstance(recipe.get("low_rank"), dict):
        raise CorpError(f"recipe in '{where}' is of kind low-rank but has no low_rank entry")
    return load_factors(where, recipe["low_rank"])


register_kind("corp-direction", _seed_direction)
register_kind("es", _seed_direction)
register_kind("low-rank", _low_rank_direction)


def produced_weights(model) -> dict:
    """What a recipe records of the model its run evaluated (`model` holds base + direction now)."""
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    return {"model_weights_hash": weights_hash(model), "model_dtype": dtypes[0] if len(dtypes) == 1 else None}


def make_recipe(
    model: str,
    model_id: str,
    base_hash: str,
    param_filter: ParamFilter,
    direction: Direction,
    made_by: dict,
    low_rank: dict | None = None,
    kind: str | None = None,
    scheme: str = SCHEME_VERSION,
    produced: dict | None = None,
) -> dict:
    """`model`: the --model the run was given (alias/name); `model_id`: what it resolved to.
    `low_rank`: the entry `lowrank.write_factors` returned, when `direction` is low-rank.
    `kind`: default `low-rank` with a factors entry, else `corp-direction`.
    `scheme`: the noise scheme the run's Perturber materialised the direction under.
    `produced`: `produced_weights(model)` of the evaluated model (what apply must rebuild)."""

    if isinstance(direction, LowRankDirection) != (low_rank is not None):
        raise CorpError("a low-rank direction needs its factors entry (lowrank.write_factors), and only a low-rank one")
    kind = kind or ("low-rank" if low_rank is not None else "corp-direction")
    if kind not in RECIPE_KINDS:
        raise CorpError(f"unknown recipe kind '{kind}'; known: {', '.join(RECIPE_KINDS)}")
    recipe = {
        "format": RECIPE_FORMAT,
        "kind": kind,
        "base_model": str(model),
        "base_model_id": str(model_id),
        "base_weights_hash": base_hash,
        "noise_scheme": check_scheme(scheme, "make_recipe"),
        "param_filter": {"include": param_filter.include, "exclude": param_filter.exclude},
        "components": [] if low_rank is not None else direction.to_json(),
        "made_by": made_by,
    }
    if low_rank is not None:
        recipe["low_rank"] = low_rank
    if produced is not None:
        recipe.update(produced)
    return recipe


def write_recipe(path: str | Path, recipe: dict) -> None:
    if recipe.get("format") != RECIPE_FORMAT or recipe.get("kind") not in RECIPE_KINDS:
        raise CorpError("write_recipe takes what make_recipe returns")  # the one writer: no hand-built recipes
    write_json(path, recipe)


_LEGACY_ES_KEYS = {"base_model", "base_weights_hash", "noise_scheme", "param_filter", "components", "made_by"}


def _upgrade(recipe: dict, path) -> dict:
    """A recipe of an older format in the current shape (kind, base_model, base_model_id)."""
    fmt = recipe.get("format")
    method = (recipe.get("made_by") or {}).get("method") if isinstance(recipe.get("made_by"), dict) else None
    if fmt in OLD_FORMATS:
        kind = "low-rank" if recipe.get("low_rank") else ("es" if method == "es" else "corp-direction")
        return {**recipe, "format": RECIPE_FORMAT, "kind": kind, "upgraded_from": fmt}
    if fmt is None and _LEGACY_ES_KEYS <= set(recipe) and method == "es":
        # the first ES recipes: no format, base named by its resolved (hub) id only
        return {
            **recipe,
            "format": RECIPE_FORMAT,
            "kind": "es",
            "base_model_id": recipe["base_model"],
            "upgraded_from": "es-recipe-v0",
        }
    return recipe


def load_recipe(path: str | Path) -> dict:
    recipe = read_json(path)
    if not isinstance(recipe, dict):
        raise CorpError(f"'{path}' is not a corp recipe (format '{RECIPE_FORMAT}')")
    recipe = _upgrade(recipe, path)
    if recipe.get("format") != RECIPE_FORMAT:
        raise CorpError(f"'{path}' is not a corp recipe (format '{recipe.get('format')}', expected '{RECIPE_FORMAT}')")
    if recipe.get("kind") not in RECIPE_KINDS:
        raise CorpError(
            f"recipe '{path}' is of kind '{recipe.get('kind')}', which "
            f"this corp cannot rebuild (known: {', '.join(RECIPE_KINDS)})"
        )
    missing = [k for k in ("base_model", "base_weights_hash", "noise_scheme", "param_filter") if not recipe.get(k)]
    if missing:
        raise CorpError(f"recipe '{path}' lacks {', '.join(missing)}")
    check_scheme(
        recipe.get("noise_scheme"), f"recipe '{path}'"
    )  # an older scheme still rebuilds; an unknown one is refused
    return recipe


def _bad_number(x, low: float, high: float, positive: bool = False) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return True
    return (x <= 0 if positive else x < low) or x > high


def _refuse(path, where: str, value, expected: str):
    """The one line of `check_numbers` for a value that is not what a recipe holds there."""
    raise CorpError(
        f"recipe '{path}': {where} is {value!r}, expected {expected}; "
        "the recipe was edited or corrupted, so it cannot be rebuilt"
    )


def _check_component(c, where: str, path) -> None:
    """A plain component: an object with a non-negative integer seed, a sigma and a coef in range."""
    if not isinstance(c, dict):
        _refuse(path, where, c, "an object {seed, sigma, coef}")
    seed = c.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        _refuse(path, f"{where} seed", seed, "a non-negative integer")
    if _bad_number(c.get("sigma"), 0.0, MAX_SIGMA, positive=True):
        _refuse(path, f"{where} sigma", c.get("sigma"), f"a finite number in (0, {MAX_SIGMA:g}]")
    if _bad_number(c.get("coef", 1.0), -MAX_COEF, MAX_COEF):
        _refuse(path, f"{where} coef", c.get("coef"), f"a finite number of size at most {MAX_COEF:g}")


def _check_merged(c: dict, i: int, path) -> None:
    """A merged term (component `i`): its scale in range and a list of plain components."""
    if _bad_number(c.get("scale"), -MAX_COEF, MAX_COEF):
        _refuse(path, f"component {i} scale", c.get("scale"), f"a finite number of size at most {MAX_COEF:g}")
    if not isinstance(c["merged"], list):
        _refuse(path, f"component {i} merged", c["merged"], "a list")
    for j, m in enumerate(c["merged"]):
        _check_component(m, f"component {i}.{j}", path)


def check_numbers(recipe: dict, path) -> None:
    """One line for the first number of `recipe` that is not finite or not in range (module docstring)."""
    comps = recipe.get("components", [])
    if not isinstance(comps, list):
        _refuse(path, "components", comps, "a list")
    for i, c in enumerate(comps):
        if isinstance(c, dict) and "merged" in c:
            _check_merged(c, i, path)
        else:
            _check_component(c, f"component {i}", path)
    low = recipe.get("low_rank")
    if isinstance(low, dict) and "scale" in low and _bad_number(low["scale"], -MAX_COEF, MAX_COEF):
        _refuse(path, "low_rank scale", low["scale"], f"a finite number of size at most {MAX_COEF:g}")
    h = recipe.get("model_weights_hash")
    if h is not None and not (isinstance(h, str) and _SHA256.match(h)):
        _refuse(path, "model_weights_hash", h, "a sha256 hex digest")


def base_candidates(recipe: dict) -> list[str]:
    """Names to try for the recipe's base, in order (see the module docstring)."""

    names = [recipe["base_model"]]
    model_id = recipe.get("base_model_id") or recipe["base_model"]
    names += [alias for alias, spec in ALIASES.items() if isinstance(spec, EmbeddedGGUF) and spec.hf_id == model_id]
    names.append(model_id)
    return list(dict.fromkeys(str(n) for n in names))


def resolve_base(recipe: dict, model: str | None) -> tuple[str, Path]:
    """(name, local directory) of the base to apply `recipe` to; never downloads before trying local ones."""

    if model:
        return model, resolve_model(model)[1]
    names = base_candidates(recipe)
    for name in names:
        try:
            return name, resolve_model(name, download=False)[1]
        except CorpError:
            continue
    return names[0], resolve_model(names[0])[1]  # online it may download; offline this is the one-line error


def _source(path: str | Path, out: str | Path, recipe: dict, name: str) -> dict:
    """What corp_model.json says the model was rebuilt from: the recipe and a local base as paths
    relative to the output (a directory that is moved or shared with them still finds them, and names
    nothing of this machine), a hub id or alias as it is, and the base's weights hash."""
    where = Path(out).expanduser().resolve()
    local = Path(name).expanduser()
    return {
        "recipe": os.path.relpath(Path(path).resolve(), where),
        "kind": recipe["kind"],
        "base_model": os.path.relpath(local.resolve(), where) if local.exists() else name,
        "base_weights_hash": recipe["base_weights_hash"],
    }


def apply_recipe(
    path: str | Path, out: str | Path, model: str | None = None, overwrite: bool = False, allow_mismatch: bool = False
) -> Path:
    """Rebuild the recipe's model from its base (or `model`, which must have the same weights) into `out`.

    `out` must not be a file, the current directory or a parent of it, a model cache, the base
    model's own directory, or inside a run directory, nor hold a run directory or a file corp did
    not write (`check_output_dir`); a directory without the corp marker that holds only corp models
    is replaced only with `overwrite`. All of it, and every number of the recipe, is checked
    before the model loads. The rebuilt weights must be finite and hash to the recipe's
    `model_weights_hash` (else refused unless `allow_mismatch`; module docstring)."""

    if Path(path).is_dir():
        raise CorpError(f"recipe '{path}' is a directory; pass the recipe.json file in it")
    recipe = load_recipe(path)
    check_numbers(recipe, path)
    direction = RECIPE_KINDS[recipe["kind"]](
        recipe, Path(path).parent
    )  # before the model: a missing factors file fails fast
    name, base_dir = resolve_base(recipe, model)
    protect = {"the base model's directory": base_dir, **{f"the model cache {c}": c for c in model_caches()}}
    run_dir = enclosing_run_dir(out)
    if run_dir is not None:
        raise CorpError(
            f"output '{out}' is inside the run directory '{run_dir}', whose recipe and report "
            "describe the model saved there; name a directory outside any run directory"
        )
    target = check_output_dir(out, overwrite, protect)
    base, tokenizer, _, _ = load_model(name, dtype=recipe.get("model_dtype"))
    found = weights_hash(base)
    if found != recipe["base_weights_hash"]:
        hint = (
            f" (tried '{name}' for the recipe's '{recipe['base_model']}')"
            if not model and name != recipe["base_model"]
            else ""
        )
        raise CorpError(
            f"recipe '{path}' was made for base weights {recipe['base_weights_hash'][:12]}..., but '{name}' has "
            f"{found[:12]}...{hint}; pass the right --model"
        )
    Perturber(base, ParamFilter(**recipe["param_filter"]), scheme=recipe["noise_scheme"]).apply(direction)
    import torch

    broken = [n for n, t in base.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if broken:
        raise CorpError(
            f"recipe '{path}' rebuilds {len(broken)} tensor(s) with non-finite weights "
            f"(first: {broken[0]}); nothing written"
        )
    source = _source(path, out, recipe, name)
    expected = recipe.get("model_weights_hash")
    if expected is None:
        warnings.warn(
            f"recipe '{path}' records no hash of the model it was evaluated as (written by an older corp); "
            "the rebuilt model cannot be checked against it"
        )
        source["checked"] = False
    else:
        rebuilt = weights_hash(base)
        if rebuilt != expected:
            what = (
                f"recipe '{path}' no longer rebuilds the model it was evaluated as (weights {rebuilt[:12]}..., "
                f"evaluated {expected[:12]}...): it was edited after its run"
            )
            if not allow_mismatch:
                raise CorpError(f"{what}; nothing written (pass --allow-mismatch to write this other model anyway)")
            warnings.warn(f"{what}; writing it anyway (--allow-mismatch)")
            source["mismatch"] = {"rebuilt": rebuilt, "evaluated": expected}
        source["checked"] = rebuilt == expected
    # the card is one of the model's files, written before the marker: a full disk while writing it
    # leaves the earlier model (or nothing), never a marked model without its card
    card = apply_card_text(target, Path(path), recipe, name, mismatch=source.get("mismatch"))
    extra = {CARD_FILE: card}
    return save_model(base, tokenizer, out, extra_files=extra, overwrite=overwrite, protect=protect, source=source)
