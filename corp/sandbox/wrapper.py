"""The sandbox's inner program: isolates itself, then runs one untrusted program (and its tests).

`corp.sandbox` (runner.py) starts this file as `python -I -S wrapper.py CONFIG_JSON` with the
program on stdin, the tests (if any) in a memfd, and a status pipe; it reports JSON events on that
pipe. It imports only the standard library (it runs under `-I`, with no `corp` on its path) and
is importable for linters, type checkers and the codec tests: `main()` runs only as a script.

Process tree (pid numbers as seen inside the new pid namespace):

    wrapper  --unshare(user?, mount, pid, net, ipc)--fork-->  init (pid 1)
        init: private root (see `build_root`), then
            fork --> program  (the untrusted code; rlimits, no capabilities, own uid as root)
            fork --> tester   (only with tests: runs the tests, asks the program for values)

Isolation, by what the kernel allows (`iso["level"]`):
- "namespaces+uid" (started as root): net, pid, mount and ipc namespaces, a private root, and
  a dedicated uid per concurrent program.
- "user-namespaces" (an ordinary user, unprivileged user namespaces enabled): the same
  namespaces inside a new user namespace that maps only the caller's uid; the program keeps that
  uid but holds no capabilities (bounding set emptied), may not create nested user namespaces,
  and sees none of the caller's files beyond the read-only system directories.
- "uid-only" (root with namespaces switched off) and "none": the program can touch what that uid
  can touch. The wrapper refuses to run in these unless the caller allowed it explicitly.

The private root is a fresh tmpfs holding read-only binds of /usr, /bin, /sbin, /lib*, /etc and
the interpreter's prefixes, a minimal /dev, a fresh /proc and a size-limited /tmp (working
directory /tmp/work); `pivot_root` then detaches the host's tree. The data directory, the
repository, home directories and sockets under /run are therefore not visible at all.

Tests without trust in the program (code rewards): the program's process runs the candidate code
and then serves calls; a separate tester process runs the test code, which the program never
receives (it reaches the tester through a memfd opened after the program was forked). Each call
crosses a pipe as plain data (`encode`/`decode`: None, bool, int, float, str, bytes, complex,
list, tuple, set, frozenset, dict), so the tester compares values built from builtins only: an
object whose `__eq__` always returns True cannot reach it, and the program can neither read the
asserts nor write the verdict. The tester is not dumpable (no ptrace, no /proc/PID/mem or fd by
the same uid) and ignores catchable signals; killing it only loses the verdict, which is a fail.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import math
import os
import resource
import select
import signal
import sys
import time
import traceback
import types

# ---------------------------------------------------------------- plain-data codec
#
# The program's side encodes whatever its functions return; the tester's side decodes. Only the
# decoder is a trust boundary: whatever bytes the program sends, `decode` builds builtins (or
# opaque handles to objects that stay in the program's process), never an object of the program's
# classes. Tags: {"L": list}, {"T": tuple}, {"S": set}, {"F": frozenset}, {"D": [[k, v], ...]},
# {"B": hex bytes}, {"A": hex bytearray}, {"C": [re, im]}, {"X": "nan"|"inf"|"-inf"},
# {"Y": name} (a builtin type such as `int`, as MBPP's `remove_datatype(t, int)` passes),
# {"O": handle} (an object kept in the program's process), {"N": name} (a name in the program's
# globals; sent by the tester only). None, bool, int, finite float and str are JSON scalars.
# Subclasses of the builtins (Counter, defaultdict, namedtuple, IntEnum, ...) travel as their
# builtin base, which they compare equal to.

MAX_DEPTH = 200
MAX_MESSAGE = 32 << 20  # bytes per message; a larger reply fails the call


class Unencodable(TypeError):
    pass


def encode(v, handles: dict | None = None, depth: int = 0):
    """JSON-able form of `v`; objects that are not plain data become handles when `handles` is given."""
    if depth > MAX_DEPTH:
        raise Unencodable("value nested too deeply")
    t = type(v)
    if v is None or t is bool or t is str or t is int:
        return v
    if t is float:
        return v if math.isfinite(v) else {"X": repr(v)}
    d = depth + 1
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int.__int__(v)
    if isinstance(v, float):
        return encode(float.__float__(v), None, d)
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, list):
        return {"L": [encode(x, handles, d) for x in list.__iter__(v)]}
    if isinstance(v, tuple):
        return {"T": [encode(x, handles, d) for x in tuple.__iter__(v)]}
    if isinstance(v, frozenset):
        return {"F": [encode(x, handles, d) for x in frozenset.__iter__(v)]}
    if isinstance(v, set):
        return {"S": [encode(x, handles, d) for x in set.__iter__(v)]}
    if isinstance(v, dict):
        return {"D": [[encode(k, handles, d), encode(x, handles, d)] for k, x in dict.items(v)]}
    if isinstance(v, bytes):
        return {"B": bytes.hex(v)}
    if isinstance(v, bytearray):
        return {"A": bytearray.hex(v)}
    if isinstance(v, complex):
        return {"C": [encode(complex.real.__get__(v), None, d), encode(complex.imag.__get__(v), None, d)]}
    if t is type and getattr(builtins, v.__name__, None) is v:
        return {"Y": v.__name__}
    if isinstance(v, Remote):
        return v._corp_ref()
    if handles is None:
        raise Unencodable(f"cannot pass a {t.__name__} between the program and its tests")
    h = len(handles)
    handles[h] = v
    return {"O": h}


def decode(x, resolve=None, depth: int = 0):
    """Builtins (or `Remote` handles) from `encode`'s form; `resolve(tag, key)` maps handles/names."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is str or t is int or t is float:
        return x
    if t is not dict or len(x) != 1:
        raise ValueError("malformed value from the other side")
    ((tag, body),) = x.items()
    d = depth + 1
    if tag == "L":
        return [decode(e, resolve, d) for e in _list(body)]
    if tag == "T":
        return tuple(decode(e, resolve, d) for e in _list(body))
    if tag == "S":
        return {decode(e, resolve, d) for e in _list(body)}
    if tag == "F":
        return frozenset(decode(e, resolve, d) for e in _list(body))
    if tag == "D":
        out = {}
        for pair in _list(body):
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict item")
            out[decode(pair[0], resolve, d)] = decode(pair[1], resolve, d)
        return out
    if tag == "B" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "A" and type(body) is str:
        return bytearray.fromhex(body)
    if tag == "C" and type(body) is list and len(body) == 2:
        re_, im = (decode(e, None, d) for e in body)
        if type(re_) not in (int, float) or type(im) not in (int, float):
            raise ValueError("malformed complex")
        return complex(re_, im)
    if tag == "X" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "Y" and type(body) is str and type(getattr(builtins, body, None)) is type:
        return getattr(builtins, body)
    if tag in ("O", "N") and resolve is not None:
        return resolve(tag, body)
    raise ValueError(f"unknown value tag {tag!r}")


def _list(body):
    if type(body) is not list:
        raise ValueError("malformed sequence")
    return body


# ---------------------------------------------------------------- tester-side proxies


class Remote:
    """Something that lives in the program's process; the tester holds only its name or handle."""

    __slots__ = ("_corp_chan", "_corp_key")

    def __init__(self, chan, key):
        object.__setattr__(self, "_corp_chan", chan)
        object.__setattr__(self, "_corp_key", key)

    def _corp_ref(self):
        return dict([self._corp_key])

    def __call__(self, *args, **kwargs):
        return self._corp_chan.request(
            {"op": "call", "ref": self._corp_ref(), "args": encode(list(args)), "kwargs": encode(kwargs)}
        )

    def __iter__(self):
        return iter(self._corp_chan.request({"op": "list", "ref": self._corp_ref()}))

    def __len__(self):
        return self._corp_chan.request({"op": "len", "ref": self._corp_ref()})

    def __repr__(self):
        return f"<object in the program: {self._corp_key[1]!r}>"


class RemoteError(RuntimeError):
    pass


class Channel:
    """Request/reply over two pipes, one JSON line each way."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd, self.buf = rfd, wfd, bytearray()

    def send(self, msg) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.wfd, view)
            view = view[n:]

    def recv(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                return json.loads(line)
            if len(self.buf) > MAX_MESSAGE:
                raise RemoteError("the program sent a message over the size limit")
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk

    def request(self, msg):
        self.send(msg)
        try:
            rep = self.recv()
        except EOFError:
            raise RemoteError("the program exited before answering") from None
        if type(rep) is dict and "ok" in rep:
            return decode(rep["ok"], self._resolve)
        if type(rep) is dict and type(rep.get("E")) is list and len(rep["E"]) == 2:
            name, text = (str(s)[:2000] for s in rep["E"])
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, RemoteError):
                raise cls(text)
            raise RemoteError(f"{name}: {text}")
        raise RemoteError("malformed reply from the program")

    def _resolve(self, tag, key):
        if tag == "O" and type(key) is int:
            return Remote(self, ("O", key))
        raise ValueError("the program may not send names")


def _names_used(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names_used(c)
    return out


# ---------------------------------------------------------------- kernel helpers

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000,
    0x10000000,
    0x8000000,
    0x20000000,
    0x40000000,
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    8192,
    16384,
    1 << 18,
)
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 4, 24, 38, 47
SYS_PIVOT_ROOT = {
    "x86_64": 155,
    "aarch64": 41,
    "riscv64": 41,
    "ppc64le": 203,
    "ppc64": 203,
    "s390x": 217,
    "i686": 217,
    "armv7l": 218,
}
# Host directories a Python program needs to run (read-only); everything else stays out of view.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _b(s):
    return None if s is None else (s if isinstance(s, bytes) else s.encode())


def mount(source, target, fstype, flags, data=None) -> None:
    _check(libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)), f"mount {target}")


def bind_readonly(source, target: str, extra: int = 0) -> None:
    """Bind `source` on `target` read-only, keeping the flags the kernel locks (nosuid, nodev, ...)."""
    mount(source, target, None, MS_BIND | MS_REC)
    f = os.statvfs(target).f_flag
    keep = (f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)) | (MS_RELATIME if f & 4096 else 0)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep | extra)


def drop_bounding_set() -> None:
    """No capability can ever be gained again, not even by executing a file as uid 0."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the last capability this kernel knows
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL


def drop_capabilities() -> None:
    """Empty the permitted, effective and inheritable sets (the bounding set first)."""
    drop_bounding_set()
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the wrapper


class Wrapper:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.sfd = cfg["status_fd"]
        self.iso = {
            "level": "none",
            "netns": False,
            "pidns": False,
            "mountns": False,
            "userns": False,
            "private_root": False,
            "proc": False,
            "uid": None,
            "capabilities": "kept",
            "rlimits": True,
            "clean_env": True,
            "new_session": True,
        }
        self.mode = None  # "root" | "userns" | None

    def report(self, **d) -> None:
        try:
            os.write(self.sfd, (json.dumps(d) + "\n").encode())
        except OSError:
            pass

    def fail(self, msg: str, code: int = 70):
        self.report(event="error", msg=msg)
        os._exit(code)

    # ---------------- namespaces

    def unshare(self) -> str:
        """Enter new namespaces; returns why not when none could be made."""
        why = []
        base = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
        if os.geteuid() == 0:
            if libc.unshare(base) == 0:
                self.mode = "root"
                return ""
            why.append("unshare as root: " + os.strerror(ctypes.get_errno()))
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | base) == 0:
            try:
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"{uid} {uid} 1")
                _write("/proc/self/gid_map", f"{gid} {gid} 1")
            except OSError as exc:
                self.fail(f"user namespace made but not mapped: {exc}")
            self.mode = "userns"
            self.iso["userns"] = True
            try:  # no nested user namespaces for the program (it could regain capabilities there)
                _write("/proc/sys/user/max_user_namespaces", "0")
                self.iso["nested_userns"] = False
            except OSError:
                self.iso["nested_userns"] = True
            return ""
        e = ctypes.get_errno()
        why.append("unprivileged user namespace: " + os.strerror(e))
        return "; ".join(why)

    def build_root(self, fds: dict) -> str:
        """Private root: see the module docstring. Returns the working directory."""
        cfg = self.cfg
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        self.iso["mountns"] = True
        new = next(d for d in ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var") if os.path.isdir(d))
        mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        dev = new + "/dev"
        os.mkdir(dev, 0o755)
        mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
        for name in DEVICES:
            if os.path.exists("/dev/" + name):
                open(f"{dev}/{name}", "w").close()
                mount("/dev/" + name, f"{dev}/{name}", None, MS_BIND)
        for name, to in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(to, f"{dev}/{name}")
        tmp_opts = f"size={int(cfg['tmp_mb'])}m,mode=1777"
        os.mkdir(dev + "/shm")
        mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts)
        os.mkdir(new + "/tmp")
        mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts)
        os.mkdir(new + "/proc", 0o755)
        if self.iso["pidns"]:
            try:
                mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                self.iso["proc"] = True
            except OSError:
                pass  # a container that masks parts of /proc refuses a fresh one: run without
        bound = []
        for d, (kind, ref) in fds.items():  # system directories first, then prefixes (sorted by length)
            if any(d == b or d.startswith(b + "/") for b in bound):
                continue
            target = new + d
            if kind == "link":
                os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
                os.symlink(ref, target)
                continue
            os.makedirs(target, 0o755, exist_ok=True)
            bind_readonly(f"/proc/self/fd/{ref}", target, MS_NOSUID | MS_NODEV)
            bound.append(d)
        for _, ref in fds.values():
            if isinstance(ref, int):
                os.close(ref)
        work = new + "/tmp/work"
        os.mkdir(work, 0o700)
        if self.mode == "root":
            os.chown(work, cfg["uid"], cfg["uid"])
        os.chdir(new)
        nr = SYS_PIVOT_ROOT.get(os.uname().machine)
        if nr is not None and libc.syscall(nr, b".", b".") == 0:
            _check(libc.umount2(b".", MNT_DETACH), "detach the old root")
            self.iso["root_switch"] = "pivot_root"
        else:  # unknown architecture: move the new root over / (the program cannot chroot back out)
            mount(new, "/", None, MS_MOVE)
            os.chroot(".")
            self.iso["root_switch"] = "move+chroot"
        os.chdir("/")
        try:
            mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError:
            pass
        self.iso["private_root"] = True
        return "/tmp/work"

    def open_sources(self) -> dict:
        """O_PATH handles on what the private root shows, taken before any mount covers them
        (inside the new mount namespace: a handle from the old one cannot be bound)."""
        out = {}
        paths = list(SYSTEM_DIRS) + sorted(self.cfg["expose"], key=len)
        for p in paths:
            if p in out:
                continue
            if os.path.islink(p) and p in SYSTEM_DIRS:
                out[p] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                try:
                    out[p] = ("dir", os.open(p, os.O_PATH | os.O_DIRECTORY))
                except OSError:
                    pass
        return out

    # ---------------- child setup

    def limit(self, is_program: bool) -> None:
        cfg, R = self.cfg, resource
        mem = cfg["memory_mb"] * 1024 * 1024
        cpu = cfg["cpu_s"]
        for lim, val in (
            (R.RLIMIT_AS, (mem, mem)),
            (R.RLIMIT_CPU, (cpu, cpu + 1)),
            (R.RLIMIT_NOFILE, (cfg["nofile"], cfg["nofile"])),
            (R.RLIMIT_FSIZE, (cfg["fsize_mb"] * 1048576,) * 2),
            (R.RLIMIT_CORE, (0, 0)),
        ):
            R.setrlimit(lim, val)
        if self.mode == "userns":
            # counted per (user namespace, uid) since Linux 5.14: wrapper, init, program, tester
            R.setrlimit(R.RLIMIT_NPROC, (cfg["nproc"] + 4, cfg["nproc"] + 4))
            drop_capabilities()
        elif os.geteuid() == 0:
            # counted per uid: the program and the tester share this slot's uid
            R.setrlimit(R.RLIMIT_NPROC, (cfg["nproc"] + 1, cfg["nproc"] + 1))
            drop_bounding_set()
            os.setgroups([])
            os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])  # clears the permitted and effective sets
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid change, which clears it
        libc.prctl(PR_SET_DUMPABLE, 1 if is_program else 0, 0, 0, 0)

    # ---------------- the program

    def program(self, work: str, src: str, setup: str, keep: tuple, marker_w: int | None, chan: Channel | None) -> None:
        try:
            _close_except(keep)  # the status pipe, the tests' memfd, the tester's ends: all gone
            fd = os.open(os.devnull, os.O_RDONLY)
            os.dup2(fd, 0)
            os.close(fd)
            self.limit(True)
            os.chdir(work)
            os.umask(0o077)
        except BaseException as exc:
            self.report_and_exit(f"program setup: {exc}")
        sys.argv = ["program.py"]
        sys.path[:] = [p for p in sys.path if p not in ("", ".")]
        g = {"__name__": "__main__", "__file__": "program.py", "__builtins__": builtins}
        rc, completed = _run_code(src, "program.py", g)
        if completed and setup:
            rc, completed = _run_code(setup, "setup.py", g)
        if chan is None:
            if completed and marker_w is not None:
                try:
                    os.write(marker_w, b"end")  # reached the end: see run_program's docstring
                except OSError:
                    pass
            _flush()
            os._exit(rc)
        if not completed:
            try:
                chan.send({"load_error": f"the program stopped before its tests could run (exit status {rc})"})
            except OSError:
                pass
            _flush()
            os._exit(rc)
        serve(chan, g)
        _flush()
        os._exit(0)

    def report_and_exit(self, msg):  # the status pipe may already be closed in the program
        try:
            sys.stderr.write(f"sandbox: {msg}\n")
        except BaseException:
            pass
        os._exit(71)


def _close_except(keep: tuple) -> None:
    lo = 3
    for fd in sorted(k for k in keep if k >= 3) + [1 << 16]:
        os.closerange(lo, fd)
        lo = fd + 1


def _flush() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass


def _run_code(src: str, filename: str, g: dict) -> tuple[int, bool]:
    """exec `src` in `g` the way `python file` would: (the exit status it would have, whether it
    ran to its last line rather than exiting early)."""
    try:
        exec(compile(src, filename, "exec"), g)
        return 0, True
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0, False
        if isinstance(code, int):
            return code & 0xFF, False
        try:
            print(code, file=sys.stderr)
        except BaseException:
            pass
        return 1, False
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        return 1, False


def serve(chan: Channel, g: dict) -> None:
    """The program's side of the tests: report its names, then answer calls until the tester leaves."""
    names = {}
    for k, v in list(g.items()):
        if k.startswith("__"):
            continue
        if isinstance(v, types.ModuleType):
            names[k] = "module:" + getattr(v, "__name__", "")
        else:
            names[k] = "callable" if callable(v) else "value"
    chan.send({"names": names})
    handles: dict = {}

    def resolve(tag, key):
        if tag == "N":
            return g[key]
        return handles[key]

    while True:
        try:
            req = chan.recv()
        except (EOFError, OSError, ValueError):
            return
        try:
            target = decode(req["ref"], resolve)
            if req["op"] == "call":
                value = target(*decode(req["args"], resolve), **decode(req["kwargs"], resolve))
            elif req["op"] == "list":
                value = list(target)
            elif req["op"] == "len":
                value = len(target)
            else:
                raise ValueError(f"unknown request {req['op']!r}")
            reply = {"ok": encode(value, handles)}
        except BaseException as exc:  # an exception of the program is its answer, whatever it is
            reply = {"E": [type(exc).__name__, str(exc)[:2000]]}
        try:
            chan.send(reply)
        except OSError:
            return


def tester(chan: Channel, tests: dict) -> tuple[bool, str]:
    """Run the tests against the program's names; (passed, why not)."""
    first = chan.recv()
    if type(first) is not dict or "names" not in first:
        return False, str(first.get("load_error", "no answer from the program")) if type(
            first
        ) is dict else "malformed first message"
    offered = first["names"] if type(first["names"]) is dict else {}
    ns = {"__name__": "__main__", "__builtins__": builtins}
    if tests.get("prelude"):
        exec(compile(tests["prelude"], "prelude.py", "exec"), ns)
    code = compile(tests["source"], "tests.py", "exec")
    remote = set(tests.get("remote") or ())
    for name in sorted(_names_used(code) | remote):
        if type(name) is not str:
            continue
        kind = offered.get(name)
        if name in remote:
            if kind is None:
                ns.pop(name, None)  # the program does not define it: the tests fail with NameError
                continue
        elif name in ns or hasattr(builtins, name) or kind is None:
            continue  # the tests' own names and the builtins are never the program's
        if type(kind) is str and kind.startswith("module:"):
            mod = kind[len("module:") :]
            try:
                value = __import__(mod)  # the tester's own copy, never the program's
                for part in mod.split(".")[1:]:
                    value = getattr(value, part)
                ns[name] = value
            except Exception:
                pass
        else:
            ns[name] = Remote(chan, ("N", name))
    exec(code, ns)
    return True, ""


def _ignore_signals() -> None:
    for s in signal.Signals:
        if s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            signal.signal(s, signal.SIG_IGN)
        except (OSError, ValueError, RuntimeError):
            pass


def _wait(pid: int, flags: int = 0):
    while True:
        try:
            return os.wait4(pid, flags)
        except ChildProcessError:
            return None
        except InterruptedError:
            continue


def _how(st, ru, **extra) -> dict:
    d = {"cpu_s": (ru.ru_utime + ru.ru_stime) if ru else None, "max_rss_kb": ru.ru_maxrss if ru else None, **extra}
    if st is None:
        d["how"] = "lost"
    elif os.WIFSIGNALED(st):
        d.update(how="signaled", signal=os.WTERMSIG(st))
    else:
        d.update(how="exited", code=os.waitstatus_to_exitcode(st))
    return d


def main() -> None:
    cfg = json.loads(sys.argv[1])
    sys.path += [p for p in cfg.get("site_packages", ()) if p not in sys.path]  # started with -S: see sandbox.py
    import _sitebuiltins  # what `site` would have added to the builtins: programs call exit() and help()

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()
    w = Wrapper(cfg)
    job = json.loads(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
    why = w.unshare() if cfg["namespaces"] else "namespaces switched off by the caller"
    # Nobody with this uid may ptrace or read the memory of the wrapper, init or the tester (after
    # the uid map is written: a process that is not dumpable cannot write its own map).
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if w.mode is None:
        level = "uid-only" if os.geteuid() == 0 else "none"
        w.iso.update(level=level, unavailable=why)
        if not cfg["allow_unisolated"]:
            w.report(
                event="refused",
                isolation=w.iso,
                msg=f"no isolation available ({why}); refusing to run the program with this user's rights",
            )
            sys.exit(0)
    else:
        w.iso.update(level="namespaces+uid" if w.mode == "root" else "user-namespaces", netns=True, pidns=True)
    tests_fd = cfg.get("tests_fd")
    try:
        init = os.fork()
    except OSError as exc:
        w.fail(f"fork failed: {exc}")
    if init == 0:
        run_init(w, job, tests_fd)
    supervise(w, init)


def run_init(w: Wrapper, job: dict, tests_fd: int | None) -> None:
    """pid 1 of the new namespace (or a plain child without): set up, run, report, exit."""
    cfg = w.cfg
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 then gets no signal from inside
    try:
        if w.mode is not None:
            work = w.build_root(w.open_sources())
        else:
            import tempfile

            work = tempfile.mkdtemp(prefix="corp-sbx-")
            if os.geteuid() == 0:
                os.chown(work, cfg["uid"], cfg["uid"])
        w.iso["uid"] = cfg["uid"] if os.geteuid() == 0 and w.mode != "userns" else os.getuid()
        if w.mode is not None:
            w.iso["capabilities"] = "none"
        w.iso["workdir"] = work
    except BaseException as exc:
        hint = ""
        if w.mode == "userns" and isinstance(exc, PermissionError):
            hint = (
                " (the user namespace was made but may not mount; AppArmor's "
                "kernel.apparmor_restrict_unprivileged_userns=1 does that)"
            )
        w.fail(f"init setup: {exc}{hint}")
    w.report(event="isolation", isolation=w.iso)
    checked = tests_fd is not None
    marker_r = marker_w = None
    if checked:
        req_r, req_w = os.pipe()  # tester -> program
        rep_r, rep_w = os.pipe()  # program -> tester
    else:
        marker_r, marker_w = os.pipe()
    try:
        prog = os.fork()
    except OSError as exc:
        w.fail(f"fork failed: {exc}")
    if prog == 0:
        if checked:
            w.program(work, job["code"], job.get("setup", ""), (req_r, rep_w), None, Channel(req_r, rep_w))
        w.program(work, job["code"], job.get("setup", ""), (marker_w,), marker_w, None)
    tester_pid = None
    if checked:
        os.close(req_r)
        os.close(rep_w)
        try:
            tester_pid = os.fork()
        except OSError as exc:
            w.fail(f"fork failed: {exc}")
        if tester_pid == 0:
            run_tester(w, work, tests_fd, Channel(rep_r, req_w))
        for fd in (tests_fd, rep_r, req_w):
            os.close(fd)
    else:
        os.close(marker_w)
    res = {"event": "exit"}
    if checked:
        r = _wait(tester_pid)
        res["tester"] = _how(*(r[1:] if r else (None, None)))
        r = _wait(prog, os.WNOHANG)
        if r is not None and r[0] == 0:  # still serving: the tests are over, end it
            os.kill(prog, signal.SIGKILL)
            r = _wait(prog)
            res["program"] = _how(*(r[1:] if r else (None, None)), ended_by_init=True)
        else:
            res["program"] = _how(*(r[1:] if r else (None, None)), ended_by_init=False)
    else:
        r = _wait(prog)
        res["program"] = _how(*(r[1:] if r else (None, None)), ended_by_init=False)
        os.set_blocking(marker_r, False)
        try:
            res["program"]["reached_end"] = os.read(marker_r, 16) == b"end"
        except OSError:
            res["program"]["reached_end"] = False
    w.report(**res)
    if w.mode is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    os._exit(0)


def run_tester(w: Wrapper, work: str, tests_fd: int, chan: Channel) -> None:
    try:
        os.lseek(tests_fd, 0, os.SEEK_SET)
        raw = b""
        while True:
            chunk = os.read(tests_fd, 1 << 20)
            if not chunk:
                break
            raw += chunk
        os.close(tests_fd)
        tests = json.loads(raw.decode("utf-8", "surrogatepass"))
        _close_except((w.sfd, chan.rfd, chan.wfd))
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        w.limit(False)
        _ignore_signals()
        os.chdir(work)
    except BaseException as exc:
        w.fail(f"tester setup: {exc}", 72)
    sys.argv = ["tests.py"]
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    try:
        passed, why = tester(chan, tests)
    except BaseException as exc:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        passed, why = False, f"{type(exc).__name__}: {str(exc)[:300]}"
    _flush()
    w.report(event="verdict", passed=passed, why=why)
    os._exit(0)


def supervise(w: Wrapper, init: int) -> None:
    """The wrapper after the fork: enforce the wall-clock limit on init."""
    cfg = w.cfg
    w.report(event="started", init_pid=init)
    deadline = time.monotonic() + cfg["timeout"]
    try:
        pfd = os.pidfd_open(init)
    except (OSError, AttributeError):
        pfd = None
    timed_out = False
    if pfd is not None:
        p = select.poll()
        p.register(pfd, select.POLLIN)
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
            os.kill(init, signal.SIGKILL)  # pid 1 of the namespace: the kernel kills everything in it
        except ProcessLookupError:
            pass
        w.report(event="timeout")
        if w.mode is None:
            try:
                os.killpg(0, signal.SIGKILL)  # no pid namespace: the process group is all we can reach
            except OSError:
                pass
    try:
        os.waitpid(init, 0)
    except ChildProcessError:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
