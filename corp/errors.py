"""corp's exceptions, in a module of their own at the bottom of the import graph: every corp module
may raise them, and importing them loads nothing else of corp (`from corp import CorpError` still
works for users: the package re-exports it)."""


class CorpError(Exception):
    """An error caused by user input; the CLI prints its message as one line, no traceback."""


class RunBusy(CorpError):
    """A run directory another corp process holds (RunLock): a bench process sharing a task defers the cell."""


class PromptTooLong(CorpError):
    """A prompt that, with the new tokens asked for, does not fit the model's context."""


class HeadLost(CorpError):
    """The cluster's head (GCS) went away mid-run; the run is recorded as interrupted (resumable)."""

    interrupted = True


class ClientLost(RuntimeError):
    """A client process died or stopped answering (the round goes on without it)."""
