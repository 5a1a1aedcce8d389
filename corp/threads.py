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
"""

from __future__ import annotations

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
