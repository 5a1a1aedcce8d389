"""corp's exceptions, in a module of their own at the bottom of the import graph: every corp module
may raise them, and importing them loads nothing else of corp (`from corp import CorpError` still
works for users: the package re-exports it)."""


class CorpError(Exception):
    """An error caused by user input; the CLI prints its message as one line, no traceback."""


class NotEnoughMemory(CorpError):
    """A run that does not fit the memory available now (the memory check, before any work): what else
    runs decides it, so the same command may fit later; the CLI exits with status 75 (EX_TEMPFAIL, not
    bad input's 2) so that a long-run wrapper waits and retries instead of giving up."""


class RunBusy(CorpError):
    """A run directory another corp process holds (RunLock): a bench process sharing a task defers the cell."""


class PromptTooLong(CorpError):
    """A prompt that, with the new tokens asked for, does not fit the model's context."""


class HeadLost(CorpError):
    """The cluster's head (GCS) went away mid-run; the run is recorded as interrupted (resumable)."""

    interrupted = True


class ClientLost(RuntimeError):
    """A client process died or stopped answering (the round goes on without it)."""
