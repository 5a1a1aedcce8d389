"""The sandbox for untrusted programs (the code rewards: MBPP, HumanEval, any code task), a package of
its own: `runner.py` (the host side: `run_program`, `run_many`, `isolation_level`, statuses) starts
`wrapper.py`, the program inside, which isolates itself and runs one untrusted program and its tests.

The wrapper runs as `python -I -S wrapper.py` with only the standard library and nothing of corp
on its path (so nothing of corp's or the environment's can be swapped under it). Its parts by job,
`codec.py` (the plain data that crosses between the program and its tests) and `isolation.py`
(namespaces, private root, limits), it loads by their file paths next to it, never through
`sys.path`; imported as a package module (linters, the codec's tests) it imports them as
`corp.runtime.sandbox.codec` and `corp.runtime.sandbox.isolation`. See wrapper.py's docstring.
"""

from corp.runtime.sandbox.runner import (
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
