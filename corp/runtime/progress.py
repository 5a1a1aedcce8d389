"""Whether corp draws progress bars (a process-wide switch read from the environment)."""

import os


def progress_disabled() -> bool:
    """Whether progress bars are off (CORP_NO_PROGRESS=1: tests, logs, the bench's processes)."""
    return os.environ.get("CORP_NO_PROGRESS") == "1"
