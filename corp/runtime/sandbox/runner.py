"""Sandbox for untrusted Python programs (the code rewards: MBPP, HumanEval, any code task).

`run_program(code, tests=...)` runs one program in a separate, isolated process and returns a
`SandboxResult` whose status is one of pass / fail / timeout / crash / sandbox_error;
`run_many(jobs)` runs many with bounded concurrency, results in input order. `isolation_level()`
says which isolation this machine gives (see below) without running untrusted code.

The process inside is `corp/runtime/sandbox/wrapper.py`, a module of its own started as
`python -I -S wrapper.py CONFIG` (see its docstring for the process tree): it enters new
net, pid, mount and ipc namespaces, swaps in a private root that shows only the read-only system
directories and the interpreter (no data directory, repository or home), forks a throwaway init
(pid 1: when it dies the kernel kills every process in the namespace, fork bombs and daemons
included) and runs the program with rlimits (address space, CPU seconds, processes, open files,
file size, no core), no capabilities and no_new_privs, in an empty size-limited tmpfs. The caller
enforces a wall-clock limit on top and reads stdout/stderr with a cap.

Isolation levels (`SandboxResult.isolation["level"]`):
- "namespaces+uid": started as root; the program also gets a dedicated uid per concurrent slot.
- "user-namespaces": an ordinary user where the kernel allows unprivileged user namespaces
  (`user.max_user_namespaces` > 0, and `kernel.unprivileged_userns_clone` = 1 where that exists).
- "uid-only" / "none": no namespaces could be made. The program would run with the caller's
  rights (or, as root, a bare separate uid), so it is REFUSED (status sandbox_error) unless the
  caller passes `allow_unisolated=True` or sets CORP_UNSAFE_NO_ISOLATION=1 in the environment.

Tests the program cannot see or patch (`tests=Tests(...)`, what the code tasks use): the program
runs its code and then serves calls; a separate tester process runs the test code, which the
program never receives, and gets every value back as plain data (builtins only), so it compares
values it built itself. Pass = the tests ran to the end. Without `tests`, pass = the program ran
to its last line and exited 0; `sys.exit(0)` before the asserts is a fail, but a program that
wants to claim success can forge that, so rewards never use it.

Departures from the usual practice (human-eval's `execution.py`, bigcode's harness), and why:
- Isolation comes from kernel namespaces (and a uid as root), not from monkey-patching `os`,
  `shutil` and `subprocess` inside the child ("reliability guard"): patching is trivially undone by
  the program and breaks legitimate code; namespaces are not undoable from inside.
- The tests run outside the program's process (see above), where the reference harnesses exec
  the tests in the same interpreter as the candidate, which lets it rewrite `__eq__`, read the
  asserts, or exit 0 early.
- An uncaught exception (including AssertionError and MemoryError) is a *fail*; *crash* means the
  program died from a signal other than the CPU limit (segfault, abort, file-size limit, ...).

Needs Linux. Python >= 3.9 for pidfd_open; `unshare` and `mount` are reached through libc via
ctypes since `os.unshare` only exists from Python 3.12.
"""

from __future__ import annotations

import enum
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from corp.errors import CorpError


class Status(str, enum.Enum):  # noqa: UP042  (StrEnum would change str(Status.PASS), which reports print)
    PASS = "pass"
    FAIL = "fail"
    TIMEOUT = "timeout"
    CRASH = "crash"
    SANDBOX_ERROR = "sandbox_error"


STATUSES = tuple(s.value for s in Status)


@dataclass
class SandboxResult:
    status: Status
    returncode: int | None = None  # program exit status when it exited normally
    signal: int | None = None  # signal that killed the program, if any
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False  # stdout or stderr exceeded max_output_bytes (rest discarded)
    wall_s: float = 0.0
    cpu_s: float | None = None
    max_rss_mb: float | None = None
    detail: str = ""  # why, in a few words (timeout kind, setup error, ...)
    isolation: dict = field(default_factory=dict)  # which protections were actually in force

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    def as_dict(self) -> dict:
        d = self.__dict__.copy()
        d["status"] = self.status.value
        return d


def status_counts(results: Iterable[SandboxResult]) -> dict[str, int]:
    """Counts of every status (all five keys present, zeros included)."""
    c = Counter(r.status.value for r in results)
    return {s: c.get(s, 0) for s in STATUSES}


# ---------------------------------------------------------------- uid allocation

# Each running program gets its own uid from a block that no account uses. The block start is
# randomised per caller process so that two test runs on one machine are unlikely to collide.
_UID_BLOCK = 1_000_000 + (secrets.randbelow(4000) * 1000)
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


def _take_uid() -> int:
    with _uid_lock:
        i = 0
        while _UID_BLOCK + i in _uids_in_use:
            i += 1
        uid = _UID_BLOCK + i
        _uids_in_use.add(uid)
        return uid


def _give_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


WRAPPER = str(Path(__file__).with_name("wrapper.py"))
ISOLATED_LEVELS = ("namespaces+uid", "user-namespaces")
UNSAFE_ENV = "CORP_UNSAFE_NO_ISOLATION"
MINIMAL_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp/work",
    "PYTHONDONTWRITEBYTECODE": "1",
}
# Directories the program must be able to read: the interpreter's prefixes (stdlib, venv).
_EXPOSE = sorted(
    {
        os.path.realpath(p)
        for p in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix)
        if p and os.path.isdir(p)
    }
)
# The wrapper starts with -S (no `site`: its .pth processing, e.g. an editable install's import
# hook, cost more than the rest of the start-up) and puts the site-packages directories on the
# path itself, so programs still import what is installed in the interpreter.
_SITE_PACKAGES = [p for p in __import__("site").getsitepackages() if os.path.isdir(p)]
DEFAULT_CONCURRENCY = max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Tests:
    """Tests run by a separate tester process that the program cannot see or patch.

    `source` is the test code (asserts, or `def check(...)` plus its call); the program never
    receives it. Every name it uses that is neither a builtin nor defined by the tests or the
    `prelude` is looked up in the program: a function becomes a proxy whose return values come
    back as plain data, a module is imported afresh in the tester, anything else is passed back to
    the program by name. `remote` names always come from the program (the entry point), even
    where the prelude defines them. `setup` is trusted code run in the program's process after its
    code (MBPP's tree-building setup); `prelude` is trusted code run in the tester first
    (HumanEval's prompt: its imports and helper functions such as `poly`)."""

    source: str
    setup: str = ""
    prelude: str = ""
    remote: tuple[str, ...] = ()
    __test__ = False  # not a pytest test class, whatever its name


def unsafe_allowed(allow_unisolated: bool = False) -> bool:
    """True when the caller or the environment (CORP_UNSAFE_NO_ISOLATION=1) accepts running
    programs without isolation."""
    return bool(allow_unisolated) or os.environ.get(UNSAFE_ENV, "").strip().lower() in ("1", "true", "yes")


_LEVEL_CACHE: dict[bool, dict] = {}


def isolation_level(namespaces: bool = True) -> dict:
    """The isolation this machine gives, probed once per process with an empty program:
    {"level": ..., "isolated": bool, "why": reason when not isolated}."""
    if namespaces in _LEVEL_CACHE:
        return dict(_LEVEL_CACHE[namespaces])
    r = run_program("pass", timeout=10, namespaces=namespaces, allow_unisolated=True)
    level = r.isolation.get("level", "unknown")
    info = {"level": level, "isolated": level in ISOLATED_LEVELS, "why": r.isolation.get("unavailable", "")}
    if r.status is Status.PASS:
        _LEVEL_CACHE[namespaces] = info  # a failed probe (say, out of file descriptors) is retried next time
    else:
        info.update(isolated=False, why=f"the sandbox itself failed: {r.detail}")
    return dict(info)


def _validate(timeout: float, memory_mb: int, max_processes: int, max_open_files: int, max_output_bytes: int) -> None:
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise CorpError(f"sandbox timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(memory_mb, int) and memory_mb >= 64):
        raise CorpError(
            f"sandbox memory_mb must be an integer >= 64 (the interpreter itself needs ~30 MB), got {memory_mb!r}"
        )
    if not (isinstance(max_processes, int) and max_processes >= 1):
        raise CorpError(f"sandbox max_processes must be an integer >= 1, got {max_processes!r}")
    if not (isinstance(max_open_files, int) and max_open_files >= 16):
        raise CorpError(f"sandbox max_open_files must be an integer >= 16, got {max_open_files!r}")
    if not (isinstance(max_output_bytes, int) and max_output_bytes >= 0):
        raise CorpError(f"sandbox max_output_bytes must be an integer >= 0, got {max_output_bytes!r}")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(
    code: str,
    timeout: float = 5.0,
    memory_mb: int = 1024,
    *,
    tests: Tests | None = None,
    max_processes: int = 32,
    max_open_files: int = 64,
    max_file_mb: int = 16,
    tmp_mb: int = 64,
    max_output_bytes: int = 65536,
    namespaces: bool = True,
    allow_unisolated: bool = False,
) -> SandboxResult:
    """Run `code` as `__main__` in the sandbox.

    With `tests`, pass = the tests ran to the end against the program (see `Tests`); without,
    pass = the program ran to its last line and exited 0. `timeout` is the wall-clock limit (CPU
    time is limited to the same, rounded up); `memory_mb` the address-space limit of the program
    (and of the tester). `namespaces=False` skips the namespaces (for tests of the uid layer
    alone). Where no isolation is available the program is refused (sandbox_error) unless
    `allow_unisolated=True` or CORP_UNSAFE_NO_ISOLATION=1.
    """
    if not isinstance(code, str):
        raise CorpError(f"sandbox: program must be a str, got {type(code).__name__}")
    if tests is not None and not isinstance(tests, Tests):
        raise CorpError(f"sandbox: tests must be a Tests, got {type(tests).__name__}")
    _validate(timeout, memory_mb, max_processes, max_open_files, max_output_bytes)
    uid = _take_uid()
    cfg = _wrapper_config(
        timeout, memory_mb, max_processes, max_open_files, max_file_mb, tmp_mb, uid, namespaces, allow_unisolated
    )
    job = {"code": code, "setup": tests.setup if tests is not None else ""}
    status_r, status_w = os.pipe()
    cfg["status_fd"] = status_w
    pass_fds = [status_w]
    tests_fd = None
    if tests is not None:
        tests_fd = _tests_memfd(tests)
        cfg["tests_fd"] = tests_fd
        pass_fds.append(tests_fd)
    t0 = time.monotonic()
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", WRAPPER, json.dumps(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=MINIMAL_ENV,
                cwd="/",
                start_new_session=True,
                pass_fds=pass_fds,
                close_fds=True,
            )
        except OSError as exc:
            os.close(status_r)
            return SandboxResult(
                Status.SANDBOX_ERROR, detail=f"cannot start the sandbox: {exc}", wall_s=time.monotonic() - t0
            )
        finally:
            os.close(status_w)
            if tests_fd is not None:
                os.close(tests_fd)
        try:
            proc.stdin.write(json.dumps(job).encode("utf-8", "surrogatepass"))
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        out, err, status_text, truncated, overstayed = _collect(proc, status_r, timeout + 5.0, max_output_bytes)
        wall = time.monotonic() - t0
    finally:
        _give_uid(uid)
    return _classify(out, err, status_text, truncated, overstayed, proc.returncode, wall, timeout, tests is not None)


def _wrapper_config(
    timeout, memory_mb, max_processes, max_open_files, max_file_mb, tmp_mb, uid, namespaces, allow_unisolated
) -> dict:
    """The wrapper's configuration (its command-line argument) for one program, without the fds."""
    return {
        "timeout": float(timeout),
        "memory_mb": memory_mb,
        "cpu_s": int(timeout) + 1,
        "nproc": max_processes,
        "nofile": max_open_files,
        "fsize_mb": max_file_mb,
        "tmp_mb": tmp_mb,
        "uid": uid,
        "namespaces": bool(namespaces),
        "allow_unisolated": unsafe_allowed(allow_unisolated),
        "expose": _EXPOSE,
        "site_packages": _SITE_PACKAGES,
    }


def _tests_memfd(tests: Tests) -> int:
    """The tests for the tester, in a memfd: not a pipe or a file, since only the tester reads it,
    after the program was forked and had closed its copy; nothing on disk, and no writer that
    could block."""
    tests_fd = os.memfd_create("corp-tests", os.MFD_CLOEXEC)
    os.write(
        tests_fd,
        json.dumps({"source": tests.source, "prelude": tests.prelude, "remote": list(tests.remote)}).encode(
            "utf-8", "surrogatepass"
        ),
    )
    return tests_fd


def _collect(proc: subprocess.Popen, status_r: int, limit: float, cap: int):
    """Read stdout/stderr (capped, rest drained) and the status pipe until EOF or `limit` seconds."""
    bufs = {"out": bytearray(), "err": bytearray(), "status": bytearray()}
    truncated = False
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    status_file = os.fdopen(status_r, "rb", buffering=0)
    sel.register(status_file, selectors.EVENT_READ, "status")
    deadline = time.monotonic() + limit
    overstayed = False
    open_count = 3
    try:
        while open_count:
            left = deadline - time.monotonic()
            if left <= 0:
                overstayed = True
                _kill_group(proc)
                break
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_count -= 1
                    continue
                buf = bufs[key.data]
                limit_bytes = 1 << 20 if key.data == "status" else cap
                room = limit_bytes - len(buf)
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > room:
                    truncated = truncated or key.data != "status"
    finally:
        sel.close()
        for f in (proc.stdout, proc.stderr, status_file):
            f.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
    dec = lambda b: bytes(b).decode("utf-8", "replace")  # noqa: E731
    return dec(bufs["out"]), dec(bufs["err"]), dec(bufs["status"]), truncated, overstayed


def _signal_status(r: SandboxResult, sig: int | None, cpu_s: float | None, timeout: float) -> SandboxResult:
    r.signal = sig
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and (cpu_s or 0) >= int(timeout) + 1 - 0.05):
        r.status, r.detail = Status.TIMEOUT, f"CPU-time limit {int(timeout) + 1} s ({name})"
    else:
        r.status, r.detail = Status.CRASH, f"killed by {name}"
    return r


def _classify(out, err, status_text, truncated, overstayed, wrapper_rc, wall, timeout, checked) -> SandboxResult:
    events = []
    for line in status_text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    isolation, last = _last_events(events)
    exit_ev, verdict = last.get("exit"), last.get("verdict")
    r = SandboxResult(
        Status.SANDBOX_ERROR, stdout=out, stderr=err, truncated=truncated, wall_s=wall, isolation=isolation
    )
    prog = (exit_ev or {}).get("program") or {}
    r.cpu_s = prog.get("cpu_s")
    if prog.get("max_rss_kb") is not None:
        r.max_rss_mb = prog["max_rss_kb"] / 1024
    if _decided_before_exit(r, last, overstayed, wrapper_rc, err, timeout, checked):
        return r
    how = prog.get("how")
    if how == "signaled" and not prog.get("ended_by_init"):
        return _signal_status(r, prog.get("signal"), r.cpu_s, timeout)
    if how == "exited":
        r.returncode = prog.get("code")
    if checked:
        return _tests_status(r, exit_ev, verdict)
    if how == "exited":
        return _exit_status(r, prog)
    r.detail = f"lost the program's exit status ({how})"
    return r


_LAST_OF = ("exit", "timeout", "error", "verdict", "refused")  # the events _classify reads, by kind


def _last_events(events: list) -> tuple[dict, dict]:
    """The isolation reported (by the last "isolation" or "refused" event) and the last event of
    each kind in `_LAST_OF`."""
    isolation: dict = {}
    last: dict = {}
    for ev in events:
        kind = ev.get("event")
        if kind == "isolation" or kind == "refused":
            isolation = ev.get("isolation", {})
        if kind in _LAST_OF:
            last[kind] = ev
    return isolation, last


def _decided_before_exit(r: SandboxResult, last: dict, overstayed, wrapper_rc, err, timeout, checked) -> bool:
    """Set `r` where the events settle it before the program's exit is read (refusal, set-up
    error, the tests' verdict, a timeout, no exit at all); True when they did."""
    exit_ev, timeout_ev, error_ev, verdict, refused = (last.get(k) for k in _LAST_OF)
    if refused is not None:
        r.detail = (
            refused.get("msg", "refused: no isolation")
            + f"; set {UNSAFE_ENV}=1 (or allow_unisolated=True) to run it anyway"
        )
        return True
    if error_ev is not None:
        r.detail = error_ev.get("msg", "setup error")
        return True
    if checked and verdict is not None and verdict.get("passed") is True:
        r.status = Status.PASS
        return True
    if timeout_ev is not None or (overstayed and exit_ev is None):
        r.status, r.detail = (
            Status.TIMEOUT,
            f"wall-clock limit {timeout:g} s" + (" (wrapper overstayed; process group killed)" if overstayed else ""),
        )
        return True
    if exit_ev is None:
        r.detail = f"sandbox wrapper exited with {wrapper_rc} without a result; stderr: {err[-300:]!r}"
        return True
    return False


def _tests_status(r: SandboxResult, exit_ev: dict, verdict: dict | None) -> SandboxResult:
    """With tests and no passing verdict: a fail, and why the tests did not pass."""
    tester = exit_ev.get("tester") or {}
    r.status = Status.FAIL
    if verdict is not None:
        r.detail = "tests failed" + (f": {verdict.get('why')}" if verdict.get("why") else "")
    elif tester.get("how") == "signaled":
        r.detail = f"the tests did not finish (tester killed by signal {tester.get('signal')})"
    else:
        r.detail = "the tests did not finish"
    return r


def _exit_status(r: SandboxResult, prog: dict) -> SandboxResult:
    """Without tests: pass only when the program ran to its last line and exited 0."""
    rc = r.returncode
    if rc == 0 and prog.get("reached_end"):
        r.status = Status.PASS
    elif rc == 0:
        r.status, r.detail = Status.FAIL, "exited 0 before reaching the end of the program"
    else:
        r.status, r.detail = Status.FAIL, f"exit status {rc}"
    return r


Job = Union[str, "tuple[str, Tests | None]"]


def run_many(
    programs: Sequence[Job],
    concurrency: int | None = None,
    **kwargs,
) -> list[SandboxResult]:
    """Run every program (a code string, or a `(code, Tests)` pair) through `run_program` (same
    keyword options), at most `concurrency` at once (default: the number of CPUs); results in
    input order. A failure inside the sandbox machinery for one program is that program's
    sandbox_error, never an exception."""
    jobs: list[tuple[str, Tests | None]] = []
    if concurrency is None:
        concurrency = DEFAULT_CONCURRENCY
    if not (isinstance(concurrency, int) and concurrency >= 1):
        raise CorpError(f"sandbox concurrency must be an integer >= 1, got {concurrency!r}")
    for i, p in enumerate(programs):
        code, tests = p if isinstance(p, tuple) and len(p) == 2 else (p, None)
        if not isinstance(code, str) or not (tests is None or isinstance(tests, Tests)):
            raise CorpError(f"sandbox: program {i} must be a str or a (str, Tests) pair, got {type(p).__name__}")
        jobs.append((code, tests))
    if not jobs:
        return []
    _validate(
        kwargs.get("timeout", 5.0),
        kwargs.get("memory_mb", 1024),
        kwargs.get("max_processes", 32),
        kwargs.get("max_open_files", 64),
        kwargs.get("max_output_bytes", 65536),
    )

    def one(job: tuple[str, Tests | None]) -> SandboxResult:
        try:
            return run_program(job[0], tests=job[1], **kwargs)
        except CorpError:
            raise
        except Exception as exc:  # machinery failure (fd exhaustion, ...): the program's own error
            return SandboxResult(Status.SANDBOX_ERROR, detail=f"{type(exc).__name__}: {exc}")

    if concurrency == 1 or len(jobs) == 1:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(jobs))) as pool:
        return list(pool.map(one, jobs))


__all__ = [
    "Status",
    "STATUSES",
    "SandboxResult",
    "Tests",
    "run_program",
    "run_many",
    "status_counts",
    "isolation_level",
    "unsafe_allowed",
    "ISOLATED_LEVELS",
    "UNSAFE_ENV",
    "DEFAULT_CONCURRENCY",
    "MINIMAL_ENV",
]
