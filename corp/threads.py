"""CPU thread defaults that degrade to a fair share on a busy machine (issue 16).

Why: torch on CPU runs its intra-op parallelism on GNU OpenMP (libgomp; see
`torch.__config__.parallel_info()`). Every operator is a parallel region that ends in a barrier,
and token-by-token generation of a small model runs thousands of short regions per second. With
libgomp's default wait policy a thread that reaches the barrier first spins (GOMP_SPINCOUNT =
300,000 iterations) before it sleeps. When another CPU-bound process shares the cores, the thread
that is late is descheduled, and the one that arrived first burns its time slice spinning for a
partner that cannot run; each barrier then costs a scheduler time slice instead of microseconds,
and two threads on two shared cores run far slower than one thread would
(results/contention/README.md has the measurements).

What corp does, only where the user has not decided:
- `apply_openmp_defaults()` (called when `corp` is imported, before torch loads OpenMP: the
  runtime reads these variables once, at start-up) sets OMP_WAIT_POLICY=PASSIVE, so a waiting
  thread sleeps at once and gives its core to whoever can use it. Nothing is changed when any of
  OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME is set, or CORP_OMP_DEFAULTS=0.
- `default_threads()` (used when --threads is not given) counts the cores this process may run on
  (`os.sched_getaffinity`) and subtracts those other runnable tasks already occupy (the kernel's
  instantaneous count of runnable tasks in /proc/loadavg, sampled a few times), keeping at least
  one: an idle 2-core machine gets 2 threads, a machine with another busy process gets 1.
  The choice is made once per run; a process that starts competing later is met by the passive
  wait policy alone.
"""

from __future__ import annotations

import os
import statistics
import time

#: variables that mean the user chose OpenMP's waiting behaviour themselves
USER_WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def apply_openmp_defaults(environ=os.environ) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE unless the user set a wait policy (or CORP_OMP_DEFAULTS=0).
    Returns whether it set it. Has an effect only before the OpenMP runtime starts (torch import)."""
    if environ.get("CORP_OMP_DEFAULTS", "1") == "0" or any(k in environ for k in USER_WAIT_SETTINGS):
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def other_runnable(samples: int = 5, interval: float = 0.02, path: str = "/proc/loadavg") -> int | None:
    """Runnable tasks other than this one, from the kernel's instantaneous count (the 4th field of
    /proc/loadavg, 'running/total', counts the reader itself); the median of a few samples. None
    where the file does not exist."""
    counts = []
    for i in range(samples):
        try:
            with open(path) as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, int(statistics.median(counts)) - 1)


def default_threads(cores: int | None = None, others: int | None = None) -> int:
    """Torch threads for a run without --threads: the usable cores minus those other runnable
    tasks occupy, at least 1 (cores, others: measured when not given)."""
    cores = usable_cores() if cores is None else cores
    if others is None:
        others = other_runnable()
    if others is None:
        return cores
    return max(1, cores - others)


#: variables with which the user fixes the thread count themselves (torch follows them)
USER_THREAD_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def run_threads(requested: int | None, environ=os.environ) -> int | None:
    """The torch thread count a run sets: --threads when given; None (leave torch's own choice)
    when the user fixed it with OMP_NUM_THREADS/MKL_NUM_THREADS; else `default_threads()`."""
    if requested:
        return requested
    if any(environ.get(k) for k in USER_THREAD_SETTINGS):
        return None
    return default_threads()
