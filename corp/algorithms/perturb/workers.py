"""Per-tensor work on parallel workers, one per torch thread.

Tensors are independent (each has its own noise stream), and torch draws one tensor's normals on
one core, so building or applying a direction runs one tensor per worker; drawing the normals is
most of the cost of an apply or a build. The bits do not depend on the workers.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import torch

from corp.runtime.threads import serial_ops_in_this_thread


class Scratch:
    """One worker's CPU generator and fp32 buffers, reused across tensors and calls: a fresh
    buffer per tensor would page-fault more than the numbers cost to draw. A buffer grows to the
    largest tensor its worker has built (tensors come largest first), so only the workers that
    built the largest tensors hold buffers that large."""

    def __init__(self) -> None:
        self.gen = torch.Generator(device="cpu")
        self._bufs: dict[str, torch.Tensor] = {}
        self.stop = threading.Event()  # set by per_tensor once its caller is gone: a long task may end early

    def buffer(self, slot: str, numel: int) -> torch.Tensor:
        """A flat fp32 buffer of at least `numel` elements, one per slot ("noise", "tmp")."""
        if slot not in self._bufs or self._bufs[slot].numel() < numel:
            self._bufs[slot] = torch.empty(numel, dtype=torch.float32)
        return self._bufs[slot]


class ScratchPool:
    """Scratch for concurrent workers: each task takes one no other task holds, and gives it back."""

    def __init__(self) -> None:
        self._free: list[Scratch] = []
        self._lock = threading.Lock()

    def take(self) -> Scratch:
        with self._lock:
            return self._free.pop() if self._free else Scratch()

    def give(self, scratch: Scratch) -> None:
        with self._lock:
            self._free.append(scratch)


def tensor_workers(numel: int) -> int:
    """How many tensors are built at once, for `numel` elements in all: torch's thread count (the
    cores corp was given), or 1 for small models, where starting threads costs more than it saves."""
    return max(1, torch.get_num_threads()) if numel >= 1 << 20 else 1


_WORKER_PREFIX = "corp-tensor"


def per_tensor(fn: Callable, items: Sequence[tuple[str, torch.Size]], scratch: ScratchPool | None = None) -> Iterator:
    """fn(name, shape, scratch) for every tensor, largest first, on `tensor_workers` threads
    (torch releases the GIL in its kernels, and draws one tensor's normals on one core); yields
    the results as they finish, in no fixed order. Each call holds a Scratch of its own (from `scratch`, else a
    fresh one). Only for per-tensor work whose result does not depend on the thread it ran on or
    on the order of the tensors."""
    pool = scratch or ScratchPool()
    order, stop = sorted(items, key=lambda it: -it[1].numel()), threading.Event()

    def task(item):
        own = pool.take()
        own.stop = stop
        try:
            with torch.no_grad():  # grad mode is per thread: a worker starts with it on
                return fn(item[0], item[1], own)
        finally:
            pool.give(own)

    workers = tensor_workers(sum(shape.numel() for _, shape in order))
    if (
        workers <= 1 or len(order) <= 1 or threading.current_thread().name.startswith(_WORKER_PREFIX)
    ):  # inside a worker: no nesting
        yield from map(task, order)
        return
    # The workers live for one call. Kept alive between calls, they would count as OpenMP threads while the model
    # generates, and libgomp then cuts its spinning: generation ran 1.4x slower beside an idle pool (step-search).
    with ThreadPoolExecutor(
        workers, thread_name_prefix=_WORKER_PREFIX, initializer=serial_ops_in_this_thread
    ) as executor:
        # at most 2 tasks per worker submitted and not yet consumed: a caller that streams the results (a weights
        # iterator) holds a few tensors at a time, not a copy of the model; and results come as they finish, so
        # one long tensor does not hold the other workers up
        todo = iter(order)
        running = {executor.submit(task, item) for item in itertools.islice(todo, 2 * workers)}
        try:
            while running:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    running |= {executor.submit(task, item) for item in itertools.islice(todo, 1)}
                    yield future.result()
        finally:
            stop.set()  # what runs may end early too (one tensor's Gram part at 1.5B runs for hours)
            for future in running:  # an error, or a consumer that stopped early: drop what has not started
                future.cancel()
