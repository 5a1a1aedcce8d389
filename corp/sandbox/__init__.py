"""The sandbox for untrusted programs (the code rewards: MBPP, HumanEval, any code task), a package of
its own: `runner.py` (the host side: `run_program`, `run_many`, `isolation_level`, statuses) starts
`wrapper.py`, the program inside, which isolates itself and runs one untrusted program and its tests.

The wrapper is one file on purpose: it runs as `python -I -S wrapper.py` with only the standard
library and nothing of corp on its path (so nothing of corp's or the environment's can be swapped
under it), and so cannot import a sibling module. It is importable for the codec's tests.
"""

from corp.sandbox.runner import (
    DEFAULT_CONCURRENCY,
    STATUSES,
    UNSAFE_ENV,
    SandboxResult,
    Status,
    Tests,
    isolation_level,
    run_many,
    run_program,
    status_counts,
    unsafe_allowed,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "STATUSES",
    "UNSAFE_ENV",
    "SandboxResult",
    "Status",
    "Tests",
    "isolation_level",
    "run_many",
    "run_program",
    "status_counts",
    "unsafe_allowed",
]
