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
`corp` is imported (the CLI imports it first), looks at what the machine's cores did over the last
50 ms (/proc/stat) before torch loads OpenMP (the runtime reads its wait settings once, at
start-up). Cores in use by other work: OMP_WAIT_POLICY=PASSIVE, so a waiting thread sleeps at once
and gives its core to whoever can use it. Cores idle: GOMP_SPINCOUNT=10000, a short spin (tens of
microseconds) that catches the partner thread at most barriers of a busy generation loop without
a futex wake-up. Measured on this project's 2-core machine, 64-prompt arith passes of the embedded
model, fresh processes alternating (results/quickstart-levers/README.md): idle, spinning took 6.2-8.2 s
against passive's 9.7-11.4 s (1.3-1.5x); beside another 2-thread torch job, 21.7-25.6 s against
15.5-19.8 s (passive 1.3x faster). So the choice is made at start from what runs then; work that starts
later beside a spinning run costs both, and a user who knows better sets a variable. Nothing is
changed when any of OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME is set by the user, or CORP_OMP_DEFAULTS=0;
a child of a corp process (CORP_OMP_CHOSEN inherited) waits passively without probing;
where /proc/stat cannot be read, passive. The thread count stays torch's (all usable cores): a thread count cut to the
free cores was measured too and was slower than two passive threads on the same shared machine
(the scheduler shares CPU time per thread, so fewer threads also means a smaller share).

Worker threads that are themselves the parallelism (corp.algorithms.perturb.workers.per_tensor) run
torch's operators on one OpenMP thread each (`serial_ops_in_this_thread`), through the libgomp
torch loaded (`torch_openmp`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import time

#: variables that mean the user chose OpenMP's waiting behaviour themselves
USER_WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


SPIN_COUNT = "10000"  # iterations a waiting thread spins before it sleeps when the cores are idle
IDLE_BELOW = 0.25  # other work under this many cores' worth over the probe: idle
PROBE_S = 0.05  # how long the probe watches the cores
CHOSEN_ENV = "CORP_OMP_CHOSEN"  # the variable corp set, for its child processes to tell it from the user's
_CHOSEN: dict = {}  # what apply_openmp_defaults set in this process, and the cores it saw


def cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot, from /proc/stat's first line; None where it
    cannot be read (not Linux). Busy counts steal: a core another guest took is not free."""
    try:
        with open(path) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    guest = sum(fields[8:10])  # already inside user and nice
    return sum(fields) - guest - idle, sum(fields) - guest


def busy_cores(probe_s: float = PROBE_S, read=cpu_times) -> float | None:
    """Cores' worth of work other processes did over `probe_s` (this process sleeps through it), or
    None where the cores cannot be read."""
    first = read()
    time.sleep(probe_s)
    second = read()
    if first is None or second is None or second[1] <= first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1)


def apply_openmp_defaults(environ=os.environ, busy=busy_cores) -> str | None:
    """Unless the user set a wait setting (or CORP_OMP_DEFAULTS=0): GOMP_SPINCOUNT=SPIN_COUNT when the
    cores are idle (`busy()` under IDLE_BELOW), else OMP_WAIT_POLICY=PASSIVE; a child of a corp process
    (CHOSEN_ENV inherited: a Ray worker, a client, a command a test runs) waits passively, whatever its
    parent chose: it is one of several processes at work, where spinning costs (a test file of Ray and
    federated runs took 45 s with spinning children against 28 s passive). Returns the variable it set, or
    None. Has an effect only before the OpenMP runtime starts (torch import)."""
    inherited = environ.get(CHOSEN_ENV)
    if inherited in USER_WAIT_SETTINGS and inherited in environ:  # set by a corp parent, not the user
        del environ[inherited]
    if environ.get("CORP_OMP_DEFAULTS", "1") == "0" or any(k in environ for k in USER_WAIT_SETTINGS):
        return None
    others = None if inherited else busy()
    idle = others is not None and others < IDLE_BELOW
    var, value = ("GOMP_SPINCOUNT", SPIN_COUNT) if idle else ("OMP_WAIT_POLICY", "PASSIVE")
    environ[var] = value
    environ[CHOSEN_ENV] = var
    if environ is os.environ:
        _CHOSEN.update(var=var, busy_cores=None if others is None else round(others, 2), child=bool(inherited))
    return var


def wait_setting(environ=os.environ) -> dict:
    """The OpenMP wait setting this process runs with and who chose it, for run_status.json: it moves
    generation's speed by 1.3-1.5x, so a run's timing is read beside it."""
    found = {k: environ[k] for k in USER_WAIT_SETTINGS if k in environ}
    if _CHOSEN and _CHOSEN["var"] in found:
        if _CHOSEN["child"]:
            return {**found, "chosen_by": "corp at import (a child of a corp process)"}
        return {**found, "chosen_by": "corp at import", "busy_cores_at_start": _CHOSEN["busy_cores"]}
    return {**found, "chosen_by": "the environment" if found else "nobody (OpenMP's default)"}


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
