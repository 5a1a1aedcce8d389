"""Adversarial programs through `corp.runtime.sandbox`: each must be contained and scored 0.

Every test checks the harm itself (a planted file, a listening socket, a secret, this process),
not only the status, so that none can pass vacuously; where it can, a test also runs the attack
the unprotected way (no namespaces, or the program concatenated with its asserts as before) and
shows that it would have worked. Short timeouts keep the file fast.

Tests marked "as an ordinary user" drop to uid 65534 in a forked child (CI runs as root), after
making the interpreter and the repository reachable for that uid in a private mount namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path

import pytest

from corp.errors import CorpError
from corp.runtime.sandbox import STATUSES, Status, Tests, run_many, run_program, status_counts
from corp.runtime.sandbox import runner as sandbox
from corp.runtime.sandbox.wrapper import decode, encode

REPO = Path(__file__).resolve().parents[1]

LINUX = os.name == "posix" and os.path.isdir("/proc")
pytestmark = pytest.mark.skipif(not LINUX, reason="the sandbox needs Linux")
ROOT = LINUX and os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="namespaces and the separate uid need root")
# What this machine gives, from the sandbox's own probe (an empty program). Where the kernel has no
# namespaces for us or refuses them (user.max_user_namespaces=0, AppArmor's userns restriction, a
# default Docker container even as root), the level is `none`/`uid-only` and the tests that need
# isolation skip with the probe's reason; corp then refuses model code, which
# test_without_isolation_model_code_is_refused checks. Where namespaces are granted and the sandbox
# breaks after that, the level is an isolated one (or `unknown`): nothing skips and the tests fail.
ISO = sandbox.isolation_level() if LINUX else {"level": "none", "why": "not Linux"}
UNAVAILABLE = ISO["level"] in ("none", "uid-only")
needs_isolation = pytest.mark.skipif(UNAVAILABLE, reason=f"no sandbox isolation here ({ISO['level']}: {ISO['why']})")


def _uid_processes(uid: int) -> list[int]:
    """pids of live (non-zombie) processes whose real uid is `uid`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            out.append(int(pid))
    return out


def prog(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


# ---------------------------------------------------------------- basics


@needs_isolation
def test_pass_fail_crash_and_statuses():
    ok = run_program("def f(x):\n    return x + 1\nassert f(1) == 2\nprint('done')", timeout=5)
    assert ok.status is Status.PASS and ok.stdout == "done\n" and ok.passed
    bad = run_program("def f(x):\n    return x\nassert f(1) == 2", timeout=5)
    assert bad.status is Status.FAIL and "AssertionError" in bad.stderr
    seg = run_program("import ctypes\nctypes.string_at(0)", timeout=5)
    assert seg.status is Status.CRASH and seg.signal == 11
    syntax = run_program("def f(:\n  pass", timeout=5)
    assert syntax.status is Status.FAIL and "SyntaxError" in syntax.stderr
    counts = status_counts([ok, bad, seg, syntax])
    assert counts == {"pass": 1, "fail": 2, "timeout": 0, "crash": 1, "sandbox_error": 0}
    assert set(counts) == set(STATUSES)


def test_bad_input_is_a_one_line_corp_error():
    with pytest.raises(CorpError, match="timeout"):
        run_program("pass", timeout=0)
    with pytest.raises(CorpError, match="memory_mb"):
        run_program("pass", memory_mb=1)
    with pytest.raises(CorpError, match="str"):
        run_program(b"pass")  # type: ignore[arg-type]
    with pytest.raises(CorpError, match="concurrency"):
        run_many(["pass"], concurrency=0)
    assert run_many([]) == []


@needs_isolation
@needs_root
def test_isolation_record_says_what_was_applied():
    r = run_program("import os\nprint(os.getuid(), os.getcwd(), sorted(os.listdir('.')))", timeout=5)
    assert r.passed
    iso = r.isolation
    assert iso["level"] == "namespaces+uid" and iso["netns"] and iso["pidns"] and iso["mountns"] and iso["private_root"]
    uid, cwd, listing = r.stdout.split(" ", 2)
    assert int(uid) == iso["uid"] != 0
    assert cwd == iso["workdir"] and listing.strip() == "[]"  # an empty working directory
    assert sandbox.isolation_level()["isolated"]


# ---------------------------------------------------------------- adversarial programs


@needs_isolation
def test_infinite_loop_times_out():
    t = time.monotonic()
    r = run_program("while True:\n    pass", timeout=2)
    assert r.status is Status.TIMEOUT and not r.passed
    assert time.monotonic() - t < 6


@needs_isolation
@needs_root
def test_fork_bomb_is_contained_and_fully_killed():
    bomb = prog(
        """
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
        """
    )
    t = time.monotonic()
    r = run_program(bomb, timeout=2, max_processes=16)
    assert r.status is Status.TIMEOUT and time.monotonic() - t < 8
    assert _uid_processes(r.isolation["uid"]) == []  # nothing of that uid survives


@needs_isolation
@needs_root
def test_daemonised_child_does_not_outlive_the_program():
    src = prog(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()               # leave the process group
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
        print(os.getpid())
        """
    )
    r = run_program(src, timeout=5)
    assert r.passed
    time.sleep(0.2)
    assert _uid_processes(r.isolation["uid"]) == []


@needs_isolation
def test_allocating_50_gb_fails_and_leaves_the_caller_alive():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_program("x = bytearray(50 * 1024 ** 3)\nx[-1] = 1\nprint('allocated')", timeout=5, memory_mb=512)
    assert not r.passed and r.status in (Status.FAIL, Status.CRASH)
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr
    assert r.max_rss_mb is not None and r.max_rss_mb < 512
    assert (
        os.getpid() and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000
    )  # < ~100 MB growth here


def _plant() -> tuple[str, dict[str, str]]:
    """A root-owned 0755 directory with 0644 files, the way a careless host would leave them."""
    d = tempfile.mkdtemp(prefix="corp-planted-")
    os.chmod(d, 0o755)
    files = {}
    for name in ("keep.txt", "data.csv"):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(f"planted {name}\n")
        os.chmod(path, 0o644)
        files[path] = f"planted {name}\n"
    return d, files


def _destroyer(d: str, files: dict[str, str], escape: list[str]) -> str:
    return prog(
        f"""
        import os
        files = {list(files)!r}
        for path in files:
            try:
                print('read', open(path).read().strip())
            except OSError as exc:
                print('cannot read', type(exc).__name__)
        for path in {escape!r}:
            try:
                with open(path, 'w') as f:
                    f.write('escaped')
            except OSError:
                pass
        for path in files:
            try:
                with open(path, 'w') as f:
                    f.write('overwritten')
            except OSError:
                pass
        try:
            os.rename(files[0], files[0] + '.moved')
        except OSError:
            pass
        for path in files:
            os.remove(path)                  # raises when contained: the program must not pass
        os.rmdir({d!r})
        """
    )


@needs_isolation
@needs_root
def test_writing_and_deleting_outside_the_working_directory():
    d, files = _plant()
    tag = os.urandom(4).hex()
    escape = [
        f"/tmp/corp-escape-{tag}",
        f"/var/tmp/corp-escape-{tag}",
        f"/dev/shm/corp-escape-{tag}",
        os.path.join(d, "new.txt"),
        str(REPO / f"corp-escape-{tag}"),
        "/corp-escape-" + tag,
    ]
    try:
        r = run_program(_destroyer(d, files, escape), timeout=5)
        assert not r.passed and r.status is Status.FAIL
        for path, content in files.items():
            assert open(path).read() == content  # planted files survive, unchanged
        for path in escape:
            assert not os.path.exists(path), path  # nothing written outside the working directory
    finally:
        for path in escape:
            if os.path.exists(path):
                os.remove(path)
        for path in list(files) + [os.path.join(d, "new.txt")]:
            if os.path.exists(path):
                os.remove(path)
        os.rmdir(d)


@needs_root
def test_separate_uid_alone_protects_visible_files():
    """Without the mount namespace the planted files are visible; the uid still protects them."""
    d, files = _plant()
    try:
        r = run_program(_destroyer(d, files, []), timeout=5, namespaces=False, allow_unisolated=True)
        assert r.isolation["level"] == "uid-only"
        assert not r.passed and r.status is Status.FAIL
        assert "read planted keep.txt" in r.stdout  # the program really saw the files
        assert "PermissionError" in r.stderr
        for path, content in files.items():
            assert open(path).read() == content
        assert not os.path.exists(r.isolation["workdir"])  # its temporary working directory is gone
    finally:
        for path in files:
            if os.path.exists(path):
                os.remove(path)
        for extra in os.listdir(d):
            os.remove(os.path.join(d, extra))
        os.rmdir(d)


@needs_isolation
@needs_root
def test_no_network_connection_arrives():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]
    try:
        src = prog(
            f"""
            import socket
            s = socket.create_connection(('127.0.0.1', {port}), timeout=2)
            s.sendall(b'hello from the sandbox')
            s.close()
            """
        )
        r = run_program(src, timeout=5)
        assert not r.passed and r.status is Status.FAIL
        assert r.isolation["netns"]
        srv.settimeout(0.5)
        with pytest.raises(socket.timeout):
            conn, _ = srv.accept()
            conn.close()
    finally:
        srv.close()


@needs_isolation
def test_printing_100_mb_is_capped():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    src = (
        "import sys\nline = 'x' * (1 << 20)\nfor _ in range(100):\n    "
        "sys.stdout.write(line)\nsys.stdout.flush()\nraise AssertionError('printed')\n"
    )
    r = run_program(src, timeout=10, max_output_bytes=65536)
    assert not r.passed and r.status is Status.FAIL
    assert r.truncated and len(r.stdout) == 65536 and "AssertionError" in r.stderr  # ran to the end, output capped
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000


@needs_isolation
@needs_root
def test_killing_the_parent_or_the_caller_fails():
    me = os.getpid()
    programs = [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('parent killed')",
        f"import os, signal\nos.kill({me}, signal.SIGKILL)\nprint('caller killed')",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('everyone killed')",
        "def f():\n    return 1\nassert f() == 1",  # an honest program alongside them
    ]
    results = run_many(programs, concurrency=4, timeout=5)
    assert [r.status for r in results[:2]] == [Status.FAIL, Status.FAIL]
    assert results[2].status in (Status.FAIL, Status.CRASH)  # Linux's kill(-1) spares the caller: ESRCH
    assert "PermissionError" in results[0].stderr and "parent killed" not in results[0].stdout
    assert "caller killed" not in results[1].stdout and "everyone killed" not in results[2].stdout
    assert results[3].passed and os.getpid() == me


@needs_isolation
def test_exit_before_the_asserts_is_not_a_pass():
    body = "def f():\n    return 1\n{exit}\nassert f() == 2\n"
    for exit_stmt in ("import sys; sys.exit(0)", "raise SystemExit", "import os; os._exit(0)", "exit()"):
        r = run_program(body.format(exit=exit_stmt), timeout=5)
        assert r.status is Status.FAIL and r.returncode == 0 and not r.passed, exit_stmt


@needs_isolation
def test_parent_environment_is_not_visible(monkeypatch):
    secret = "s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv("CORP_SANDBOX_SECRET", secret)
    src = prog(
        """
        import os
        print(sorted(os.environ))
        for pid in ('1', str(os.getppid())):
            try:
                print(open('/proc/%s/environ' % pid).read())
            except OSError as exc:
                print('denied', type(exc).__name__)
        assert os.environ.get('CORP_SANDBOX_SECRET'), 'secret not visible'
        """
    )
    r = run_program(src, timeout=5)
    assert not r.passed and r.status is Status.FAIL
    assert secret not in r.stdout and secret not in r.stderr and "CORP_SANDBOX_SECRET" not in r.stdout
    assert "secret not visible" in r.stderr


@needs_isolation
def test_many_adversarial_programs_in_parallel_keep_order_and_counts():
    programs = [
        "while True: pass",
        "assert 1 == 2",
        "print(1)",
        "import sys; sys.exit(0)\nassert 0",
        "x = bytearray(50 * 1024 ** 3)",
        "print(2)",
    ]
    results = run_many(programs, concurrency=2, timeout=2)
    assert [r.status for r in results] == [
        Status.TIMEOUT,
        Status.FAIL,
        Status.PASS,
        Status.FAIL,
        Status.FAIL,
        Status.PASS,
    ]
    assert results[2].stdout == "1\n" and results[5].stdout == "2\n"
    assert status_counts(results) == {"pass": 2, "fail": 3, "timeout": 1, "crash": 0, "sandbox_error": 0}


def test_refused_without_namespaces_unless_allowed(tmp_path):
    """Without isolation (here: namespaces switched off) nothing runs unless the caller accepts it."""
    target = tmp_path / "written"
    src = f"open({str(target)!r}, 'w').write('x')\nprint('ran')"
    r = run_program(src, timeout=5, namespaces=False)
    assert r.status is Status.SANDBOX_ERROR and "refusing" in r.detail and sandbox.UNSAFE_ENV in r.detail
    assert r.stdout == "" and not target.exists()
    if not ROOT:  # as root the bare uid protects tmp_path (0700) even when allowed
        ok = run_program(src, timeout=5, namespaces=False, allow_unisolated=True)
        assert ok.passed and ok.isolation["level"] == "none" and target.exists()


@pytest.mark.skipif(not UNAVAILABLE, reason="isolation is available here; the ordinary-user tests below check refusal")
def test_without_isolation_model_code_is_refused(tmp_path):
    """On a machine that refuses namespaces, corp runs no model code unless the caller accepts the risk."""
    target = tmp_path / "written"
    r = run_program(f"open({str(target)!r}, 'w').write('x')\nprint('ran')", timeout=5)
    assert r.status is Status.SANDBOX_ERROR and "refusing" in r.detail and sandbox.UNSAFE_ENV in r.detail
    assert r.stdout == "" and not target.exists() and r.isolation["level"] == ISO["level"]


# ---------------------------------------------------------------- rewards that could be faked


def test_plain_data_codec_builds_only_builtins():
    class Liar(int):
        def __eq__(self, other):
            return True

    values = [
        None,
        True,
        3,
        -0.0,
        float("inf"),
        "s",
        b"b",
        bytearray(b"a"),
        1j,
        [1, (2,)],
        {3},
        frozenset({4}),
        {(1, 2): [None]},
        int,
    ]
    from corp.runtime.sandbox import codec

    assert encode is codec.encode and decode is codec.decode  # the wrapper's own are the codec module's
    for v in values:
        assert decode(json.loads(json.dumps(encode(v)))) == v
    assert type(decode(encode(Liar(5)))) is int and decode(encode(Liar(5))) != 6  # a subclass travels as its base
    for bad in ({"O": 1}, {"N": "x"}, {"Z": 1}, {"L": 1}, {"C": ["a", 1]}, {"Y": "open"}, [1, 2], {"S": [{"L": []}]}):
        with pytest.raises((ValueError, TypeError)):
            decode(bad)


@needs_isolation
def test_object_whose_eq_is_always_true_does_not_pass():
    cheat = prog(
        """
        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        def add(a, b):
            return Anything()
        """
    )
    asserts = "assert add(2, 2) == 5\n"
    old_way = run_program(cheat + asserts, timeout=5)  # the program concatenated with its asserts, as before
    assert old_way.passed  # the attack works there
    r = run_program(cheat, timeout=5, tests=Tests(asserts, remote=("add",)))
    assert r.status is Status.FAIL and "AssertionError" in r.stderr
    honest = run_program(
        "def add(a, b):\n    return a + b\n", timeout=5, tests=Tests("assert add(2, 2) == 4\n", remote=("add",))
    )
    assert honest.passed


@needs_isolation
def test_program_cannot_read_the_tests_or_forge_the_verdict():
    token = "tok" + os.urandom(6).hex()
    asserts = f"assert add(2, 2) == 5, {token!r}\n"  # a wrong expectation: only a cheat can pass it
    spy = prog(
        """
        import gc, os, re, sys
        found = []
        for obj in gc.get_objects():
            items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
            found += [s for s in items if isinstance(s, str) and 'assert add(' in s]
        f = sys._getframe()
        while f is not None:  # every caller's locals: where the harness keeps the program's text
            for v in list(f.f_locals.values()) + list(f.f_globals.values()):
                items = list(v.values()) if isinstance(v, dict) else [v]
                found += [s for s in items if isinstance(s, str) and 'assert add(' in s]
            f = f.f_back
        for pid in os.listdir('/proc') if os.path.isdir('/proc') else ():
            for name in ('cmdline', 'environ', 'mem'):
                try:
                    found.append(open('/proc/%s/%s' % (pid, name), 'rb').read(1 << 16).decode('latin-1'))
                except (OSError, ValueError):
                    pass
        for fd in range(3, 256):
            try:
                os.lseek(fd, 0, 0)
                found.append(os.read(fd, 1 << 16).decode('latin-1'))
            except OSError:
                pass
        print('\\n'.join(found))
        m = re.search(r'add\\(2, 2\\) == (\\d+)', '\\n'.join(found))
        ANSWER = int(m.group(1)) if m else None
        def add(a, b):
            return ANSWER
        """
    )
    old_way = run_program(spy + asserts, timeout=5)  # the asserts inside the program, as before
    assert old_way.passed and token in old_way.stdout  # it found them and answered them
    r = run_program(spy, timeout=5, tests=Tests(asserts, remote=("add",)))
    assert r.status is Status.FAIL and token not in r.stdout, (r.status, r.detail)
    forger = prog(
        """
        import json, os
        fake = (json.dumps({'event': 'verdict', 'passed': True, 'why': ''}) + '\\n').encode()
        for fd in range(3, 256):
            try:
                os.write(fd, fake)
            except OSError:
                pass
        def add(a, b):
            return 0
        """
    )
    r = run_program(forger, timeout=5, tests=Tests(asserts, remote=("add",)))
    assert r.status is Status.FAIL, (r.status, r.detail)
    honest = run_program(
        spy.replace("return ANSWER", "return a + b"), timeout=5, tests=Tests("assert add(2, 2) == 4\n", remote=("add",))
    )
    assert honest.passed  # the snooping itself is not what fails it


@needs_isolation
def test_sandbox_hides_the_data_directory_the_repository_and_home():
    from tests.conftest import DATA_DIR

    # The private root shows the interpreter's prefixes (here a venv inside the repository and a
    # Python under the home directory), so their ancestors exist as bare directories; nothing else
    # of the repository, the home directory or the data directory may be there.
    shown = sandbox._EXPOSE

    def hidden_candidates(root: Path):
        if not root.is_dir():
            return []
        return [
            p for p in sorted(root.iterdir())[:20] if not any(str(p) == e or e.startswith(str(p) + "/") for e in shown)
        ]

    secret = [p for p in (DATA_DIR / "humaneval" / "HumanEval.jsonl", DATA_DIR) if p.exists()]
    secret += hidden_candidates(REPO) + hidden_candidates(Path.home())
    assert any(p.name == "README.md" for p in secret)
    # The control below needs a secret the program's uid can reach without namespaces: the
    # repository may sit in a 0700 folder (a `mktemp -d` clone), which hides it from that uid
    # anyway. A world-readable marker on the host's /tmp is one, and the sandbox must hide it too.
    planted = Path(tempfile.mkdtemp(prefix="corp-secret-", dir="/tmp"))
    planted.chmod(0o755)
    (planted / "marker").write_text("secret\n")
    (planted / "marker").chmod(0o644)
    secret.append(planted / "marker")
    try:
        src = prog(
            f"""
            import os, sys
            for p in {[str(p) for p in secret]!r}:
                if os.path.exists(p):
                    print('visible', p)
            print('path', [p for p in sys.path if p == {str(REPO)!r} or p.startswith({str(REPO / "corp")!r})])
            print('modules', [m for m in ('codec', 'isolation', 'corp', 'importlib.util') if m in sys.modules])
            print('listing', sorted(os.listdir('/')))
            """
        )
        if ROOT:
            # the old sandbox as root showed the whole tree to the program's uid: the attack had worked
            old_way = run_program(src, timeout=5, namespaces=False, allow_unisolated=True)
            assert f"visible {planted / 'marker'}" in old_way.stdout, old_way.stdout
        r = run_program(src, timeout=5)
        assert r.passed and "visible" not in r.stdout, r.stdout
        # the wrapper compiles its sibling modules from their files: nothing of corp on the program's
        # path, and no import machinery (importlib.util would also read and write __pycache__ bytecode,
        # which then runs before isolation)
        assert "path []\nmodules []\n" in r.stdout, r.stdout
        listing = r.stdout.split("listing ", 1)[1]
        for top in ("home", "srv", "mnt", "media", "opt", "var", "run", "boot"):
            assert f"'{top}'" not in listing
    finally:
        shutil.rmtree(planted)


def test_the_wrapper_writes_and_reads_no_bytecode(tmp_path, monkeypatch):
    """The wrapper's siblings (codec.py, isolation.py) run before isolation, with the caller's rights:
    loading them through the import system would write .pyc files into __pycache__ on the first run
    and execute whatever .pyc is there on later ones. The planted case: a fresh copy of the sandbox's
    files, a program run from it, and then no __pycache__ beside them."""
    for f in ("wrapper.py", "codec.py", "isolation.py"):
        shutil.copy(Path(sandbox.__file__).with_name(f), tmp_path / f)
    monkeypatch.setattr(sandbox, "WRAPPER", str(tmp_path / "wrapper.py"))
    r = run_program("def f():\n    return [1, 2]\nprint(6 * 7)\n", timeout=10, tests=Tests("assert f() == [1, 2]"))
    assert not (tmp_path / "__pycache__").exists(), sorted(p.name for p in (tmp_path / "__pycache__").iterdir())
    assert r.passed and "42" in r.stdout, (r.status, r.detail, r.stdout)


def test_what_a_tested_program_printed_is_kept_when_init_ends_it():
    """Planted: once the tests are over, init kills a program still serving calls; output left in its stdout
    buffer (a pipe: block-buffered) was lost, about 1 run in 4 (a passed run with no stdout; found as a flaky
    test). Twelve runs, each printing before and during the tests: all keep their output (with the bug, all
    twelve keeping it had a chance of about 3%)."""
    src = "def f(x):\n    print('called', x)\n    return x * 2\nprint(6 * 7)\n"
    for i in range(12):
        r = run_program(src, timeout=10, tests=Tests("assert f(3) == 6"))
        assert r.passed and "42" in r.stdout and "called 3" in r.stdout, (i, r.status, r.detail, r.stdout)


# ---------------------------------------------------------------- as an ordinary user (CI runs as root)

NOBODY = 65534
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def _reachable_for_others(paths):
    """In a private mount namespace, cover each non-world-searchable ancestor of `paths` (here
    /root, 0700, above the interpreter) with an empty tmpfs and bind the paths themselves back."""
    _mount(None, "/", None, 16384 | (1 << 18))  # MS_REC | MS_PRIVATE
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in paths}
    groups: dict[str, list[str]] = {}
    for p in paths:
        parts = p.strip("/").split("/")
        for k in range(1, len(parts) + 1):
            a = "/" + "/".join(parts[:k])
            if not os.stat(a).st_mode & 0o001:
                groups.setdefault(a, []).append(p)
                break
    for top, inner in groups.items():
        _mount("tmpfs", top, "tmpfs", 0, "mode=0755")
        for p in inner:
            os.makedirs(p, exist_ok=True)
            _mount(f"/proc/self/fd/{fds[p]}", p, None, 4096 | 16384)  # MS_BIND | MS_REC


def _as_user(fn, *, no_user_namespaces=False):
    """Run `fn()` in a forked child as uid/gid 65534 and return its JSON-able result. With
    `no_user_namespaces`, the child sits in a user namespace whose limit on nested user
    namespaces is 0: the kernel then refuses them, as on a machine that disables them."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()  # the parent maps the child's user namespace (the child cannot: no
    ready_r, ready_w = os.pipe()  # CAP_SETUID left in the parent namespace once it unshared)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if no_user_namespaces and libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
                os.write(ready_w, b"u")
                os.read(go_r, 1)
                with open("/proc/sys/user/max_user_namespaces", "w") as f:
                    f.write("0")
            elif (
                no_user_namespaces
            ):  # no user namespaces here at all (a locked-down container): already the case to test
                os.write(ready_w, b"n")
                os.read(go_r, 1)
                if libc.unshare(CLONE_NEWNS) != 0:
                    raise OSError(ctypes.get_errno(), "unshare")
            elif libc.unshare(CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            need = {
                os.path.realpath(p)
                for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), str(REPO))
            }
            _reachable_for_others(sorted(need, key=len))
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            sandbox._LEVEL_CACHE.clear()
            out = {"ok": fn()}
        except BaseException:
            out = {"error": traceback.format_exc()}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    if no_user_namespaces:
        if os.read(ready_r, 1) == b"u":
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write("0 0 4294967295")  # identity: uid 65534 inside is uid 65534 on the host
        os.write(go_w, b"g")
    for fd in (go_r, go_w, ready_r, ready_w):
        os.close(fd)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, st = os.waitpid(pid, 0)
    assert os.WIFEXITED(st), f"the unprivileged child died: status {st}"
    out = json.loads(b"".join(chunks) or b'{"error": "no result"}')
    assert "error" not in out, out["error"]
    return out["ok"]


def _userns_available() -> bool:
    """Whether this kernel lets an ordinary user make user namespaces and mount in them."""

    def sysctl(name: str, default: str) -> str:
        p = Path("/proc/sys") / name
        return p.read_text().strip() if p.exists() else default

    return (
        int(sysctl("user/max_user_namespaces", "0")) > 0
        and sysctl("kernel/unprivileged_userns_clone", "1") != "0"
        and sysctl("kernel/apparmor_restrict_unprivileged_userns", "0") != "1"
    )


needs_root_to_drop = pytest.mark.skipif(not ROOT, reason="dropping to another uid needs root (CI runs as root)")


@needs_isolation
@needs_root_to_drop
@pytest.mark.skipif(not _userns_available(), reason="this kernel has no unprivileged user namespaces")
def test_as_an_ordinary_user_the_program_is_isolated():
    d = tempfile.mkdtemp(prefix="corp-host-")
    os.chmod(d, 0o777)  # writable by the ordinary user: only isolation can protect it
    keep = os.path.join(d, "keep.txt")
    Path(keep).write_text("planted\n")
    os.chmod(keep, 0o666)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]

    def attack(kills: str) -> str:
        return prog(
            f"""
            import os, signal, socket
            for path in ({keep!r}, {os.path.join(d, "new.txt")!r}):
                try:
                    open(path, 'w').write('escaped')
                    print('wrote', path)
                except OSError as exc:
                    print('write failed', type(exc).__name__)
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')
                print('connected')
            except OSError as exc:
                print('connect failed', type(exc).__name__)
            for target in ({kills}):
                try:
                    os.kill(target, signal.SIGKILL)
                except OSError:
                    pass
            print('done')
            """
        )

    def inside():
        me = os.getpid()
        r = run_program(attack(f"{me}, os.getppid(), -1"), timeout=10)
        srv.settimeout(0.3)
        try:
            srv.accept()[0].close()
            arrived = True
        except TimeoutError:
            arrived = False
        checked = run_program(
            "def add(a, b):\n    return a + b\n", timeout=5, tests=Tests("assert add(2, 2) == 4\n", remote=("add",))
        )
        return {
            "uid": os.getuid(),
            "status": r.status.value,
            "level": r.isolation.get("level"),
            "stdout": r.stdout,
            "arrived": arrived,
            "alive": os.getpid() == me,
            "checked": checked.status.value,
            "probe": sandbox.isolation_level(),
        }

    def unprotected():
        # the same attack without namespaces (what `run_program` did for an ordinary user before),
        # minus the kills (kill(-1) would reach every process of this uid on the machine)
        r = run_program(attack(""), timeout=10, namespaces=False, allow_unisolated=True)
        srv.settimeout(2)
        try:
            srv.accept()[0].close()
            arrived = True
        except TimeoutError:
            arrived = False
        return {"level": r.isolation.get("level"), "stdout": r.stdout, "arrived": arrived}

    try:
        got = _as_user(inside)
        assert got["uid"] == NOBODY and got["level"] == "user-namespaces" and got["probe"]["isolated"]
        assert got["status"] == "pass" and "done" in got["stdout"] and got["alive"] and got["checked"] == "pass"
        assert "wrote" not in got["stdout"] and "connected" not in got["stdout"] and not got["arrived"]
        assert Path(keep).read_text() == "planted\n" and not os.path.exists(os.path.join(d, "new.txt"))
        bare = _as_user(unprotected)  # the attack works there: these checks can fail
        assert (
            bare["level"] == "none" and "wrote" in bare["stdout"] and "connected" in bare["stdout"] and bare["arrived"]
        )
        assert Path(keep).read_text() == "escaped"
    finally:
        srv.close()
        for name in os.listdir(d):
            os.remove(os.path.join(d, name))
        os.rmdir(d)


@needs_isolation
@needs_root_to_drop
def test_as_an_ordinary_user_the_parent_cannot_be_killed():
    def inside():
        me = os.getpid()
        src = (
            f"import os, signal\nos.kill({me}, signal.SIGKILL)\nos.kill(os.getppid(), "
            "signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n"
        )
        r = run_program(src, timeout=5)
        return {"alive": os.getpid() == me, "status": r.status.value, "level": r.isolation.get("level")}

    if _userns_available():
        got = _as_user(inside)
        assert got["alive"] and got["level"] == "user-namespaces" and got["status"] in ("fail", "crash")

    # without namespaces the same uid can kill its caller: run it in a grandchild we can lose
    def unprotected():
        pid = os.fork()
        if pid == 0:
            run_program(
                f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\n",
                timeout=5,
                namespaces=False,
                allow_unisolated=True,
            )
            os._exit(0)
        _, st = os.waitpid(pid, 0)
        return {"killed": os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGKILL}

    assert _as_user(unprotected)["killed"]


@needs_isolation
@needs_root_to_drop
def test_as_an_ordinary_user_without_user_namespaces_code_is_refused_unless_allowed(monkeypatch):
    from corp.evaluate.tasks.base import Example
    from corp.evaluate.tasks.coding import MBPP

    ex = Example(
        "mbpp-x",
        "p",
        "",
        columns={"task_id": 0, "entry_point": "add", "test_setup_code": "", "test_list": ["assert add(2, 2) == 4"]},
    )
    completion = "```python\ndef add(a, b):\n    return a + b\n```"
    d = tempfile.mkdtemp(prefix="corp-host-")
    os.chmod(d, 0o777)
    target = os.path.join(d, "written")

    def inside():
        out = {"probe": sandbox.isolation_level()}
        r = run_program(f"open({target!r}, 'w').write('x')\n", timeout=5)
        out.update(status=r.status.value, detail=r.detail, written_when_refused=os.path.exists(target))
        try:
            MBPP().reward([completion], [ex])
            out["task"] = "ran"
        except CorpError as exc:
            out["task"] = str(exc)
        task = MBPP(unsafe_no_isolation=1)
        out["allowed"] = task.reward([completion], [ex])
        out["counts"] = task.last_status_counts()
        os.environ[sandbox.UNSAFE_ENV] = "1"
        r = run_program(f"open({target!r}, 'w').write('x')\n", timeout=5)
        out.update(env_status=r.status.value, written_when_allowed=os.path.exists(target))
        return out

    try:
        got = _as_user(inside, no_user_namespaces=True)
    finally:
        for name in os.listdir(d):
            os.remove(os.path.join(d, name))
        os.rmdir(d)
    assert got["probe"]["level"] == "none" and not got["probe"]["isolated"]
    assert got["status"] == "sandbox_error" and "refusing" in got["detail"] and not got["written_when_refused"]
    assert "unsafe_no_isolation=1" in got["task"] and sandbox.UNSAFE_ENV in got["task"]
    assert got["allowed"] == [1.0] and got["counts"]["isolation:none"] == 1
    assert got["env_status"] == "pass" and got["written_when_allowed"]  # accepted: it really runs unprotected
