"""OpenMP defaults that degrade to a fair share on a busy machine (issue 16).

Why: torch on CPU runs its intra-op parallelism on GNU OpenMP (libgomp; see
`torch.__config__.parallel_info()`). Every operator is a parallel region that ends in a barrier,
and token-by-token generation of a small model runs thousands of short regions per second. With
libgomp's default wait policy a thread that reaches the barrier first spins (GOMP_SPINCOUNT =
300,000 iterations) before it sleeps. When other processes share the cores, the thread that is
late is descheduled, and the one that arrived first burns its time slice spinning for a partner
that cannot run; each barrier then costs scheduler time slices instead of microseconds. Measured
on 2 shared cores (results/contention/README.md): 2 spinning threads took 100-200 s per
specialist where 2 passive threads took 13-16 s and 1 thread 18-22 s.

What corp does, only where the user has not decided: `apply_openmp_defaults()`, called when
`corp` is imported (the CLI imports it first), sets OMP_WAIT_POLICY=PASSIVE before torch loads
OpenMP (the runtime reads it once, at start-up), so a waiting thread sleeps at once and gives its
core to whoever can use it. Nothing is changed when any of OMP_WAIT_POLICY, GOMP_SPINCOUNT or
KMP_BLOCKTIME is set, or CORP_OMP_DEFAULTS=0. Child processes (Ray workers, sandboxed programs)
inherit it. The thread count stays torch's (all usable cores): a thread count cut to the free
cores was measured too and was slower than two passive threads on the same shared machine (the
scheduler shares CPU time per thread, so fewer threads also means a smaller share).
The price, measured on a quiet machine: when nothing else runs, passive waiting is about 1.3x
slower per specialist than spinning (6.1 vs 4.5 s); under contention it is 2.6x faster. Set
GOMP_SPINCOUNT on a dedicated machine.

Worker threads that are themselves the parallelism (corp.algorithms.perturb.direction.per_tensor) run
torch's operators on one OpenMP thread each (`serial_ops_in_this_thread`), through the libgomp
torch loaded (`torch_openmp`).
"""

from __future__ import annotations

import ctypes
import functools
import os

#: variables that mean the user chose OpenMP's waiting behaviour themselves
USER_WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def apply_openmp_defaults(environ=os.environ) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE unless the user set a wait policy (or CORP_OMP_DEFAULTS=0).
    Returns whether it set it. Has an effect only before the OpenMP runtime starts (torch import)."""
    if environ.get("CORP_OMP_DEFAULTS", "1") == "0" or any(k in environ for k in USER_WAIT_SETTINGS):
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


@functools.cache
def torch_openmp() -> ctypes.CDLL | None:
    """The libgomp that torch loaded (the same handle), or None where torch runs on another runtime.
    Cached: call it once torch is imported (it reads the libraries this process has loaded). Other
    packages bring libgomps of their own (scikit-learn's is mapped below torch's once it is
    imported), so the one in torch's directory is taken, else the only one there is."""
    import torch

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    try:
        with open("/proc/self/maps") as maps:
            paths = list(dict.fromkeys(line.split()[-1] for line in maps if "libgomp" in line))
    except OSError:
        return None
    path = next((p for p in paths if p.startswith(torch_dir)), paths[0] if len(paths) == 1 else None)
    return ctypes.CDLL(path) if path else None


def serial_ops_in_this_thread() -> None:
    """Make torch's operators single-threaded in the calling (worker) thread only. The workers
    are the parallelism here: with OpenMP teams of their own, W workers would run W x T threads on
    T cores. libgomp keeps the thread count per thread, so the main thread keeps its T. Where
    torch's runtime is not libgomp (or cannot be found), nothing changes."""
    import torch

    omp = torch_openmp()
    if omp is not None:
        # ATen sets a thread's OpenMP thread count to its global one at the thread's first
        # parallel_for: call one first, so that ours is the setting that stays
        torch.softmax(torch.ones(1, 4), dim=-1)  # calls at::parallel_for on one row: no team is started
        omp.omp_set_num_threads(1)
