"""Sandbox for untrusted Python programs (the code rewards: MBPP, HumanEval, any code task).

`run_program(code)` runs one program in a separate process and returns a `SandboxResult` whose
status is one of pass / fail / timeout / crash / sandbox_error; `run_many(programs)` runs many
with bounded concurrency, results in input order.

Process tree (one Python start per program, like a plain `subprocess.run([python, file])`):

    caller (root) --Popen, new session, minimal env--> wrapper (root, `python -I -c WRAPPER`)
        unshare(net | mount | pid | ipc) --fork--> init (pid 1 of the new pid namespace, root)
            private tmpfs on /tmp, /var/tmp, /run/lock, /dev/shm; fresh /proc --fork--> program

The program child sets rlimits (address space, CPU seconds, processes, open files, file size,
no core), drops every group, switches to a dedicated unprivileged uid (one per concurrent slot,
so RLIMIT_NPROC, which the kernel counts per uid, bounds each program separately and programs
cannot signal one another), sets no_new_privs, chdirs into an empty, size-limited tmpfs working
directory and `exec`s the code in its own interpreter. The wrapper enforces the wall-clock limit
by killing init, and when the init of a pid namespace dies the kernel kills every process in it,
so a fork bomb or a daemonised child cannot outlive its program even if it left the process
group. The caller additionally kills the whole process group if the wrapper itself overstays.
stdout/stderr are read with a cap (the rest is drained and discarded, never buffered).

Departures from the usual practice (human-eval's `execution.py`, bigcode's harness), and why:
- Isolation comes from kernel namespaces plus a separate uid, not from monkey-patching `os`,
  `shutil` and `subprocess` inside the child ("reliability guard"): patching is trivially undone by
  the program and breaks legitimate code; a uid and namespaces are not undoable from inside.
- "Passed" is not "exit status 0". The sandbox appends an epilogue that writes a per-run random
  nonce to a private pipe; a program passes only if it exits 0 *and* the nonce arrived, so
  `sys.exit(0)` / `os._exit(0)` before the asserts is a fail. The nonce guards against accidental
  early exits, not against a program that reads its own source to forge it.
- The program's parent is a throwaway init owned by root, so `os.kill(os.getppid(), SIGKILL)`
  is refused (EPERM) and cannot touch the caller.
- An uncaught exception (including AssertionError and MemoryError) is a *fail*; *crash* means the
  program died from a signal other than the CPU limit (segfault, abort, file-size limit, ...).
- Without root (or without namespace support) the sandbox degrades: what was actually applied
  is recorded in `SandboxResult.isolation`, so no run silently claims a guarantee it lacks.

Needs Linux. Python >= 3.9 for pidfd_open; `unshare` is reached through libc via ctypes since
`os.unshare` only exists from Python 3.12.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from corp import CorpError


class Status(str, enum.Enum):
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


# ---------------------------------------------------------------- the wrapper (runs as root in the child)

_WRAPPER = r'''
import ctypes, json, os, resource, select, signal, sys, time, traceback
cfg = json.loads(sys.argv[1])
SFD = cfg["status_fd"]
def report(**d):
    try:
        os.write(SFD, (json.dumps(d) + "\n").encode())
    except OSError:
        pass
src = sys.stdin.buffer.read().decode("utf-8", "replace")
iso = {"netns": False, "pidns": False, "mountns": False, "private_tmp": False, "proc": False,
       "uid": None, "rlimits": True, "clean_env": True, "new_session": True}
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x8000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
def mount(source, target, fstype, flags, data):
    if libc.mount(source, target, fstype, ctypes.c_ulong(flags), data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "mount %s: %s" % (target.decode(), os.strerror(e)))
if cfg["namespaces"]:
    if libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET) == 0:
        iso.update(netns=True, pidns=True, mountns=True)
    elif cfg["require_isolation"]:
        report(event="error", msg="unshare failed: " + os.strerror(ctypes.get_errno())); sys.exit(70)
sr, sw = os.pipe()  # marker pipe: the program's epilogue writes the nonce to sw
WORK = None
try:
    init = os.fork()
except OSError as exc:
    report(event="error", msg="fork failed: %s" % exc); sys.exit(70)
if init == 0:
    # ---------------- init: pid 1 of the new namespace (or a plain child without namespaces)
    try:
        if iso["mountns"]:
            mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
            # Handles on the interpreter's directories before anything is covered: a venv may live
            # under /tmp (a CI checkout) or under a private directory, and is bound back below.
            fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in cfg["expose"]}
            bound = set()

            def bind_back(p):
                os.makedirs(p, exist_ok=True)
                mount(("/proc/self/fd/%d" % fds[p]).encode(), p.encode(), None, MS_BIND | MS_REC, None)
                bound.add(p)

            opts = ("size=%dm,mode=1777" % cfg["tmp_mb"]).encode()
            covered = []
            for d in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm"):
                if os.path.isdir(d):
                    mount(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts)
                    covered.append(d)
            iso["private_tmp"] = True
            for p in cfg["expose"]:
                if any(p == d or p.startswith(d + "/") for d in covered):
                    bind_back(p)
            # The interpreter may live under a private directory (here /root/.pyenv, /root is 0700):
            # cover the top private ancestor with an empty tmpfs and bind only the interpreter's
            # prefix back, so the program can import the stdlib and sees nothing else there.
            groups = {}
            for p in cfg["expose"]:
                if p in bound:
                    continue
                parts = p.strip("/").split("/")
                for k in range(1, len(parts)):
                    a = "/" + "/".join(parts[:k])
                    if not (os.stat(a).st_mode & 0o001):
                        groups.setdefault(a, []).append(p)
                        break
            for top, paths in groups.items():
                mount(b"tmpfs", top.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755")
                for p in paths:
                    bind_back(p)
                iso.setdefault("masked", []).append(top)
            for fd in fds.values():
                os.close(fd)
            if iso["pidns"]:
                try:
                    mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None); iso["proc"] = True
                except OSError:
                    pass
            WORK = "/tmp/work"
            os.mkdir(WORK, 0o700)
        else:
            import tempfile
            WORK = tempfile.mkdtemp(prefix="corp-sbx-")
        uid = cfg["uid"] if os.geteuid() == 0 else None
        if uid is not None:
            os.chown(WORK, uid, uid)
        iso["uid"] = uid
        iso["workdir"] = WORK
    except BaseException as exc:
        report(event="error", msg="init setup: %s" % exc); os._exit(70)
    report(event="isolation", isolation=iso)
    try:
        prog = os.fork()
    except OSError as exc:
        report(event="error", msg="fork failed: %s" % exc); os._exit(70)
    if prog == 0:
        # ---------------- the program
        try:
            os.close(sr)
            fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
            R = resource
            mem = cfg["memory_mb"] * 1024 * 1024
            cpu = cfg["cpu_s"]
            for lim, val in ((R.RLIMIT_AS, (mem, mem)), (R.RLIMIT_CPU, (cpu, cpu + 1)),
                             (R.RLIMIT_NOFILE, (cfg["nofile"], cfg["nofile"])),
                             (R.RLIMIT_FSIZE, (cfg["fsize_mb"] * 1048576,) * 2), (R.RLIMIT_CORE, (0, 0))):
                R.setrlimit(lim, val)
            if uid is not None:
                R.setrlimit(R.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG (after the uid change, which clears it)
            os.chdir(WORK)
            os.umask(0o077)
            os.close(SFD)
        except BaseException as exc:
            report(event="error", msg="program setup: %s" % exc); os._exit(71)
        sys.argv = ["program.py"]
        sys.path[:] = [p for p in sys.path if p not in ("", ".")]
        g = {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__}
        src = src.replace("__CORP_MARKER_FD__", str(sw))
        rc = 0
        try:
            exec(compile(src, "program.py", "exec"), g)
        except SystemExit as e:
            code = e.code
            if code is None:
                rc = 0
            elif isinstance(code, int):
                rc = code & 0xFF
            else:
                try:
                    print(code, file=sys.stderr)
                except BaseException:
                    pass
                rc = 1
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
            rc = 1
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                pass
        os._exit(rc)
    # init: wait for the program, report, exit (which kills anything it left in the namespace)
    os.close(sw)
    while True:
        try:
            _, st, ru = os.wait4(prog, 0)
            break
        except ChildProcessError:
            st, ru = None, None
            break
        except InterruptedError:
            continue
    os.set_blocking(sr, False)
    try:
        marker = os.read(sr, 256).decode("ascii", "replace")
    except OSError:
        marker = ""
    res = {"event": "exit", "marker": marker, "cpu_s": (ru.ru_utime + ru.ru_stime) if ru else None,
           "max_rss_kb": ru.ru_maxrss if ru else None}
    if st is None:
        res.update(how="lost")
    elif os.WIFSIGNALED(st):
        res.update(how="signaled", signal=os.WTERMSIG(st))
    else:
        res.update(how="exited", code=os.waitstatus_to_exitcode(st))
    report(**res)
    if not iso["mountns"]:
        import shutil
        shutil.rmtree(WORK, ignore_errors=True)
    os._exit(0)
# ---------------- wrapper: enforce the wall-clock limit on init
os.close(sw); os.close(sr)
report(event="started", init_pid=init)
deadline = time.monotonic() + cfg["timeout"]
try:
    pfd = os.pidfd_open(init)
except OSError:
    pfd = None
timed_out = False
if pfd is not None:
    p = select.poll(); p.register(pfd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        try:
            if p.poll(left * 1000):
                break
        except InterruptedError:
            pass
else:
    while os.waitpid(init, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.005)
if timed_out:
    try:
        os.kill(init, signal.SIGKILL)
    except ProcessLookupError:
        pass
    report(event="timeout")
    if not iso["pidns"]:
        try:
            os.killpg(0, signal.SIGKILL)  # no pid namespace: the process group is all we can reach
        except OSError:
            pass
try:
    os.waitpid(init, 0)
except ChildProcessError:
    pass
sys.exit(0)
'''

_EPILOGUE = "\n\n__import__('os').write(__CORP_MARKER_FD__, b'{nonce}')\n"

_HAVE_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
MINIMAL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp/work", "PYTHONDONTWRITEBYTECODE": "1"}
# Directories the program must be able to read: the interpreter's prefixes (stdlib, venv).
_EXPOSE = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix) if p and os.path.isdir(p)})
DEFAULT_CONCURRENCY = max(1, os.cpu_count() or 1)


def _validate(timeout: float, memory_mb: int, max_processes: int, max_open_files: int, max_output_bytes: int) -> None:
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise CorpError(f"sandbox timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(memory_mb, int) and memory_mb >= 64):
        raise CorpError(f"sandbox memory_mb must be an integer >= 64 (the interpreter itself needs ~30 MB), got {memory_mb!r}")
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
    max_processes: int = 32,
    max_open_files: int = 64,
    max_file_mb: int = 16,
    tmp_mb: int = 64,
    max_output_bytes: int = 65536,
    namespaces: bool = True,
    require_isolation: bool = False,
) -> SandboxResult:
    """Run `code` as `__main__` in the sandbox; pass = it ran to the end and exited 0.

    `timeout` is the wall-clock limit (CPU time is limited to the same, rounded up); `memory_mb`
    the address-space limit. `namespaces=False` skips the net/pid/mount namespaces (for tests of
    the uid layer alone); `require_isolation=True` turns a missing namespace into sandbox_error.
    """
    if not isinstance(code, str):
        raise CorpError(f"sandbox: program must be a str, got {type(code).__name__}")
    _validate(timeout, memory_mb, max_processes, max_open_files, max_output_bytes)
    nonce = secrets.token_hex(16)
    source = code + _EPILOGUE.format(nonce=nonce)
    uid = _take_uid()
    cfg = {
        "timeout": float(timeout), "memory_mb": memory_mb, "cpu_s": int(timeout) + 1, "nproc": max_processes,
        "nofile": max_open_files, "fsize_mb": max_file_mb, "tmp_mb": tmp_mb, "uid": uid,
        "namespaces": bool(namespaces) and _HAVE_ROOT, "require_isolation": require_isolation, "expose": _EXPOSE,
    }
    status_r, status_w = os.pipe()
    cfg["status_fd"] = status_w
    t0 = time.monotonic()
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _WRAPPER, json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=MINIMAL_ENV, cwd="/", start_new_session=True, pass_fds=(status_w,), close_fds=True,
            )
        except OSError as exc:
            os.close(status_r)
            return SandboxResult(Status.SANDBOX_ERROR, detail=f"cannot start the sandbox: {exc}", wall_s=time.monotonic() - t0)
        finally:
            os.close(status_w)
        try:
            proc.stdin.write(source.encode("utf-8", "surrogatepass"))
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        out, err, status_text, truncated, overstayed = _collect(proc, status_r, timeout + 5.0, max_output_bytes)
        wall = time.monotonic() - t0
    finally:
        _give_uid(uid)
    return _classify(out, err, status_text, truncated, overstayed, proc.returncode, nonce, wall, timeout)


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


def _classify(out, err, status_text, truncated, overstayed, wrapper_rc, nonce, wall, timeout) -> SandboxResult:
    events = []
    for line in status_text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    isolation: dict = {}
    exit_ev = timeout_ev = error_ev = None
    for ev in events:
        kind = ev.get("event")
        if kind == "isolation":
            isolation = ev.get("isolation", {})
        elif kind == "exit":
            exit_ev = ev
        elif kind == "timeout":
            timeout_ev = ev
        elif kind == "error":
            error_ev = ev
    r = SandboxResult(Status.SANDBOX_ERROR, stdout=out, stderr=err, truncated=truncated, wall_s=wall, isolation=isolation)
    if exit_ev is not None:
        r.cpu_s = exit_ev.get("cpu_s")
        if exit_ev.get("max_rss_kb") is not None:
            r.max_rss_mb = exit_ev["max_rss_kb"] / 1024
    if error_ev is not None:
        r.detail = error_ev.get("msg", "setup error")
        return r
    if timeout_ev is not None or (overstayed and exit_ev is None):
        r.status, r.detail = Status.TIMEOUT, f"wall-clock limit {timeout:g} s" + (" (wrapper overstayed; process group killed)" if overstayed else "")
        return r
    if exit_ev is None:
        r.detail = f"sandbox wrapper exited with {wrapper_rc} without a result; stderr: {err[-300:]!r}"
        return r
    how = exit_ev.get("how")
    if how == "signaled":
        r.signal = sig = exit_ev.get("signal")
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and (r.cpu_s or 0) >= int(timeout) + 1 - 0.05):
            r.status, r.detail = Status.TIMEOUT, f"CPU-time limit {int(timeout) + 1} s ({name})"
        else:
            r.status, r.detail = Status.CRASH, f"killed by {name}"
        return r
    if how == "exited":
        r.returncode = rc = exit_ev.get("code")
        if rc == 0 and exit_ev.get("marker") == nonce:
            r.status = Status.PASS
        elif rc == 0:
            r.status, r.detail = Status.FAIL, "exited 0 before reaching the end of the program"
        else:
            r.status, r.detail = Status.FAIL, f"exit status {rc}"
        return r
    r.detail = f"lost the program's exit status ({how})"
    return r


def run_many(
    programs: Sequence[str],
    concurrency: int | None = None,
    **kwargs,
) -> list[SandboxResult]:
    """Run every program through `run_program` (same keyword options), at most `concurrency` at
    once (default: the number of CPUs); results in input order. A failure inside the sandbox
    machinery for one program is that program's sandbox_error, never an exception."""
    programs = list(programs)
    if concurrency is None:
        concurrency = DEFAULT_CONCURRENCY
    if not (isinstance(concurrency, int) and concurrency >= 1):
        raise CorpError(f"sandbox concurrency must be an integer >= 1, got {concurrency!r}")
    for i, p in enumerate(programs):
        if not isinstance(p, str):
            raise CorpError(f"sandbox: program {i} must be a str, got {type(p).__name__}")
    if not programs:
        return []
    _validate(kwargs.get("timeout", 5.0), kwargs.get("memory_mb", 1024), kwargs.get("max_processes", 32), kwargs.get("max_open_files", 64), kwargs.get("max_output_bytes", 65536))

    def one(code: str) -> SandboxResult:
        try:
            return run_program(code, **kwargs)
        except CorpError:
            raise
        except Exception as exc:  # machinery failure (fd exhaustion, ...): the program's own error
            return SandboxResult(Status.SANDBOX_ERROR, detail=f"{type(exc).__name__}: {exc}")

    if concurrency == 1 or len(programs) == 1:
        return [one(p) for p in programs]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(programs))) as pool:
        return list(pool.map(one, programs))


__all__ = ["Status", "STATUSES", "SandboxResult", "run_program", "run_many", "status_counts", "DEFAULT_CONCURRENCY", "MINIMAL_ENV"]
