"""corp: post-train language models in weight space without gradients.

This package's own module is the facade users import (`from corp import CorpError, train_corp`); no
module of corp imports it: corp's modules take `CorpError` from corp/errors.py, the version from
corp/version.py and the rest from the module that defines it, so the facade sits above everything
and the import graph has no cycle through it (tests/test_layers.py).
"""

from corp.errors import CorpError
from corp.runtime.progress import progress_disabled
from corp.runtime.threads import apply_openmp_defaults as _apply_openmp_defaults
from corp.version import __version__

# before anything imports torch: OpenMP reads its wait policy once, when it starts (corp/runtime/threads.py
# says why); this module runs first whenever any corp module is imported
_apply_openmp_defaults()

# The Python API (corp/api.py), loaded on first use so that `import corp` stays light (no torch):
# `corp.train_corp(...)`, `from corp import train_randopt`.
_API = ("Result", "train", "train_corp", "train_es", "train_grpo", "train_randopt")

__all__ = ["CorpError", "__version__", "progress_disabled", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module("corp.api"), name)
    raise AttributeError(f"module 'corp' has no attribute '{name}'")


def __dir__():
    return sorted([*globals(), *_API])
