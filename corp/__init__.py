"""corp: post-train language models in weight space without gradients."""

__version__ = "0.1.0"


class CorpError(Exception):
    """An error caused by user input; the CLI prints its message as one line, no traceback."""
