"""Recipes: a consolidated model as a few kilobytes of JSON (DESIGN.md, "Direction and recipe").

A recipe names the base model and the sha256 of its weights, the noise-scheme version, the
parameter filter and the direction's (seed, sigma, coef) components, plus how it was made.
`apply_recipe` rebuilds the model bit-exactly from the base, and refuses a base or noise scheme
that does not match, since the same seeds would then mean different weights.

A low-rank recipe (`corp consolidate --low-rank`, ours) has no components to apply; its `low_rank`
entry names the factors file beside recipe.json (unit-scale B, A per matrix), its sha256, the scale
and the ranks, and `apply_recipe` rebuilds scale * B @ A through the same Perturber path, so the
rebuilt model is bit-exact too. A missing or altered factors file is an error.
"""

from __future__ import annotations

from pathlib import Path

from corp import CorpError
from corp.perturb import SCHEME_VERSION, Direction, ParamFilter, Perturber, weights_hash
from corp.runs import read_json, write_json

RECIPE_FORMAT = "corp-recipe-v1"


def make_recipe(model: str, model_id: str, base_hash: str, param_filter: ParamFilter, direction: Direction, made_by: dict, low_rank: dict | None = None) -> dict:
    """`low_rank`: the entry `lowrank.write_factors` returned, when `direction` is low-rank."""
    from corp.consolidate.lowrank import LowRankDirection

    if isinstance(direction, LowRankDirection) != (low_rank is not None):
        raise CorpError("a low-rank direction needs its factors entry (lowrank.write_factors), and only a low-rank one")
    recipe = {
        "format": RECIPE_FORMAT,
        "base_model": model,
        "base_model_id": model_id,
        "base_weights_hash": base_hash,
        "noise_scheme": SCHEME_VERSION,
        "param_filter": {"include": param_filter.include, "exclude": param_filter.exclude},
        "components": [] if low_rank is not None else direction.to_json(),
        "made_by": made_by,
    }
    if low_rank is not None:
        recipe["low_rank"] = low_rank
    return recipe


def load_recipe(path: str | Path) -> dict:
    recipe = read_json(path)
    if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT:
        raise CorpError(f"'{path}' is not a corp recipe (format '{RECIPE_FORMAT}')")
    if recipe.get("noise_scheme") != SCHEME_VERSION:
        raise CorpError(f"recipe '{path}' uses noise scheme '{recipe.get('noise_scheme')}', this corp has '{SCHEME_VERSION}'; its seeds would mean other weights")
    return recipe


def apply_recipe(path: str | Path, out: str | Path, model: str | None = None) -> Path:
    """Rebuild the recipe's model from its base (or `model`, which must have the same weights) into `out`."""
    from corp.models import load_model, save_model

    recipe = load_recipe(path)
    if recipe.get("low_rank"):
        from corp.consolidate.lowrank import load_factors

        direction = load_factors(Path(path).parent, recipe["low_rank"])  # before the model: a missing file fails fast
    else:
        direction = Direction.from_json(recipe["components"])
    base, tokenizer, _, _ = load_model(model or recipe["base_model"], dtype=None)
    found = weights_hash(base)
    if found != recipe["base_weights_hash"]:
        raise CorpError(f"recipe '{path}' was made for base weights {recipe['base_weights_hash'][:12]}..., but '{model or recipe['base_model']}' has {found[:12]}...; pass the right --model")
    Perturber(base, ParamFilter(**recipe["param_filter"])).apply(direction)
    return save_model(base, tokenizer, out)


def write_recipe(path: str | Path, recipe: dict) -> None:
    write_json(path, recipe)
