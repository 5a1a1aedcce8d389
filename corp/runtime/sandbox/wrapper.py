"""The sandbox's inner program: isolates itself, then runs one untrusted program (and its tests).

`corp.runtime.sandbox` (runner.py) starts this file as `python -I -S wrapper.py CONFIG_JSON` with the
program on stdin, the tests (if any) in a memfd, and a status pipe; it reports JSON events on that
pipe. It imports only the standard library and its two siblings below (it runs under `-I`, with no
`corp` on its path) and is importable for linters, type checkers and the codec tests: `main()` runs
only as a script.

Where each part lives:
- wrapper.py (this file): the process tree below (`main`, `run_init`, `supervise`), the program's
  side (`Wrapper.program`, `serve`) and the tester (`run_tester`, `tester`).
- isolation.py: the namespaces (`Isolation.unshare`), the private root (`Isolation.build_root`),
  the rlimits, capabilities and uid of the program and the tester (`Isolation.limit`), the libc
  calls they need, and the status pipe (`Isolation.report`, `Isolation.fail`).
- codec.py: the plain-data codec (`encode`/`decode`) and the pipe protocol over it (`Channel`,
  `Remote`).

Run as a script, this file reads its siblings' source from their file paths next to it and
compiles it (`_sibling`), as Python compiles a script: not through `sys.path` or the import
system, so the path stays what `-I -S` made it (the standard library, then the site-packages that
`main` appends), the program sees that same path, no module joins `sys.modules` (where an `import`
in the program could pick it up), and no bytecode is written to or read from `__pycache__` (a
`.pyc` there would run before isolation). They are read at start-up, before any isolation and
with the caller's rights, from this file's own directory: the same trust as this file. Imported as `corp.runtime.sandbox.wrapper`, it imports
them as `corp.runtime.sandbox.codec` and `corp.runtime.sandbox.isolation`. The untrusted program runs in a child
forked after isolation, so it holds in memory whatever the wrapper had loaded, as it did when all
of this was one file; what it sends to the tester still crosses only as plain data, which `decode`
(the trust boundary, in the tester's process) turns into builtins.

Process tree (pid numbers as seen inside the new pid namespace):

    wrapper  --unshare(user?, mount, pid, net, ipc)--fork-->  init (pid 1)
        init: private root (see `Isolation.build_root`), then
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
import json
import os
import select
import signal
import sys
import time
import traceback
import types


def _sibling(name: str):
    """The module in `name`.py next to this file, compiled from its source (see the module
    docstring). It is named `__main__`, as its code was when it was part of this file, so that a
    traceback names its exceptions (RemoteError, Unencodable) as it did then."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    module = types.ModuleType("__main__")
    module.__file__ = path
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    exec(compile(source, path, "exec"), module.__dict__)  # no importlib: no .pyc, nothing in sys.modules
    return module


if __package__:  # imported as corp.runtime.sandbox.wrapper (linters, type checkers, the codec's tests)
    from corp.runtime.sandbox import codec, isolation
else:  # run as a script: nothing of corp on the path
    codec, isolation = _sibling("codec"), _sibling("isolation")

Channel, Remote, decode, encode = codec.Channel, codec.Remote, codec.decode, codec.encode
PR_SET_DUMPABLE, libc = isolation.PR_SET_DUMPABLE, isolation.libc


# ---------------------------------------------------------------- the wrapper


class Wrapper(isolation.Isolation):
    """The wrapper: its state and isolation (`isolation.Isolation`), and the program it runs."""

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
    """The program's side of the tests: report its names, then answer calls until the tester leaves. What the
    program printed is flushed before each message: once the tests are over init kills a program still serving
    (`_tests_ended`), and output left in its buffer was lost (a run that passed showed no output, about 1 in 4)."""
    _flush()
    chan.send({"names": _names_offered(g)})
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
        _flush()
        try:
            chan.send(reply)
        except OSError:
            return


def _names_offered(g: dict) -> dict:
    """What the program defines, by kind only (a module by its name): all the tester learns of it
    before it asks for a value."""
    names = {}
    for k, v in list(g.items()):
        if k.startswith("__"):
            continue
        if isinstance(v, types.ModuleType):
            names[k] = "module:" + getattr(v, "__name__", "")
        else:
            names[k] = "callable" if callable(v) else "value"
    return names


def _names_used(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names_used(c)
    return out


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
        _bind_program_name(ns, name, kind, chan)
    exec(code, ns)
    return True, ""


def _bind_program_name(ns: dict, name: str, kind, chan: Channel) -> None:
    """Give the tests the program's `name`: a module it imported as the tester's own copy (left
    out if the tester cannot import it), anything else as a proxy that asks the program."""
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
    sys.path += [p for p in cfg.get("site_packages", ()) if p not in sys.path]  # started with -S: see runner.py
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
    init = _fork(w)
    if init == 0:
        run_init(w, job, tests_fd)
    supervise(w, init)


def _fork(w: Wrapper) -> int:
    """os.fork(), or the error event and the end of this process: nothing can run without the child."""
    try:
        return os.fork()
    except OSError as exc:
        w.fail(f"fork failed: {exc}")


def run_init(w: Wrapper, job: dict, tests_fd: int | None) -> None:
    """pid 1 of the new namespace (or a plain child without): set up, run, report, exit.

    The program and the tester are forked here and enter `Wrapper.program` and `run_tester` from
    this frame, so the stack their code starts on is as deep as it always was."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 then gets no signal from inside
    work = _init_setup(w)
    w.report(event="isolation", isolation=w.iso)
    checked = tests_fd is not None
    marker_r = marker_w = None
    if checked:
        req_r, req_w = os.pipe()  # tester -> program
        rep_r, rep_w = os.pipe()  # program -> tester
    else:
        marker_r, marker_w = os.pipe()
    prog = _fork(w)
    if prog == 0:
        if checked:
            w.program(work, job["code"], job.get("setup", ""), (req_r, rep_w), None, Channel(req_r, rep_w))
        w.program(work, job["code"], job.get("setup", ""), (marker_w,), marker_w, None)
    tester_pid = None
    if checked:
        os.close(req_r)
        os.close(rep_w)
        tester_pid = _fork(w)
        if tester_pid == 0:
            run_tester(w, work, tests_fd, Channel(rep_r, req_w))
        for fd in (tests_fd, rep_r, req_w):
            os.close(fd)
    else:
        os.close(marker_w)
    res = {"event": "exit"}
    if checked:
        res.update(_tests_ended(tester_pid, prog))
    else:
        res["program"] = _program_ended(prog, marker_r)
    w.report(**res)
    if w.mode is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    os._exit(0)


def _init_setup(w: Wrapper) -> str:
    """init's working directory: the private root's (or, without namespaces, a temporary one),
    with what is then in force recorded in `w.iso`; a failure ends init with an error event."""
    cfg = w.cfg
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
    return work


def _tests_ended(tester_pid: int, prog: int) -> dict:
    """How the tester and then the program ended, once the tester is done; a program still serving
    calls then is ended here."""
    res = {}
    r = _wait(tester_pid)
    res["tester"] = _how(*(r[1:] if r else (None, None)))
    r = _wait(prog, os.WNOHANG)
    if r is not None and r[0] == 0:  # still serving: the tests are over, end it
        os.kill(prog, signal.SIGKILL)
        r = _wait(prog)
        res["program"] = _how(*(r[1:] if r else (None, None)), ended_by_init=True)
    else:
        res["program"] = _how(*(r[1:] if r else (None, None)), ended_by_init=False)
    return res


def _program_ended(prog: int, marker_r: int) -> dict:
    """How a program without tests ended, and whether it reached its last line (its marker)."""
    r = _wait(prog)
    how = _how(*(r[1:] if r else (None, None)), ended_by_init=False)
    os.set_blocking(marker_r, False)
    try:
        how["reached_end"] = os.read(marker_r, 16) == b"end"
    except OSError:
        how["reached_end"] = False
    return how


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
    if _outlived(init, deadline):
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


def _outlived(init: int, deadline: float) -> bool:
    """Wait for init to end (on its pidfd, else by polling waitpid); True when the deadline came first."""
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
    return timed_out


if __name__ == "__main__":
    main()
