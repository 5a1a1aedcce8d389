"""corp: post-train language models in weight space without gradients."""

__version__ = "0.1.0"

from corp.threads import apply_openmp_defaults as _apply_openmp_defaults

# before anything imports torch: OpenMP reads its wait policy once, when it starts (corp/threads.py says why)
_apply_openmp_defaults()


class CorpError(Exception):
    """An error caused by user input; the CLI prints its message as one line, no traceback."""
