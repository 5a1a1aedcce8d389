"""The sandbox's isolation: namespaces, the private root, and the limits of the program and tester.

Part of the wrapper (see wrapper.py's docstring, which describes the isolation levels and the
private root): `wrapper.py` loads this file by its path when it runs as a script
(`python -I -S wrapper.py`, nothing of corp on the path), and imports it as
`corp.runtime.sandbox.isolation` when it is itself imported (linters). So this module imports only the
standard library and nothing of corp. `unshare` and `mount` are reached through libc via ctypes.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal

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


def _make_dev(dev: str) -> None:
    """The private root's minimal /dev: a small tmpfs with binds of the harmless devices and the
    usual links to the process's own descriptors."""
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


def _bind_sources(new: str, fds: dict) -> None:
    """Show what `Isolation.open_sources` opened under `new`, read-only (a directory already shown
    through a parent is skipped), then close those handles."""
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


# ---------------------------------------------------------------- the wrapper's isolation


class Isolation:
    """The wrapper's state (its configuration, the isolation in force, the status pipe it reports
    on) and the steps that isolate it; `wrapper.Wrapper` adds the program's side."""

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
        """Private root: see wrapper.py's docstring. Returns the working directory."""
        cfg = self.cfg
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        self.iso["mountns"] = True
        new = next(d for d in ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var") if os.path.isdir(d))
        mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        dev = new + "/dev"
        _make_dev(dev)
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
        _bind_sources(new, fds)
        work = new + "/tmp/work"
        os.mkdir(work, 0o700)
        if self.mode == "root":
            os.chown(work, cfg["uid"], cfg["uid"])
        os.chdir(new)
        self._switch_root(new)
        os.chdir("/")
        try:
            mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError:
            pass
        self.iso["private_root"] = True
        return "/tmp/work"

    def _switch_root(self, new: str) -> None:
        """Make `new` (the working directory) the root and detach the host's tree from view."""
        nr = SYS_PIVOT_ROOT.get(os.uname().machine)
        if nr is not None and libc.syscall(nr, b".", b".") == 0:
            _check(libc.umount2(b".", MNT_DETACH), "detach the old root")
            self.iso["root_switch"] = "pivot_root"
        else:  # unknown architecture: move the new root over / (the program cannot chroot back out)
            mount(new, "/", None, MS_MOVE)
            os.chroot(".")
            self.iso["root_switch"] = "move+chroot"

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
