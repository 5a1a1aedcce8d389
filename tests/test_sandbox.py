"""Adversarial programs through `corp.evaluate.sandbox`: each must be contained and scored 0.

Every test checks the harm itself (a planted file, a listening socket, a secret, this process),
not only the status, so that none can pass vacuously. Short timeouts keep the file fast.
"""

from __future__ import annotations

import os
import resource
import socket
import stat
import tempfile
import textwrap
import time

import pytest

from corp import CorpError
from corp.evaluate.sandbox import STATUSES, Status, run_many, run_program, status_counts

pytestmark = pytest.mark.skipif(os.name != "posix" or not os.path.isdir("/proc"), reason="the sandbox needs Linux")
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="namespaces and the separate uid need root")


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


@needs_root
def test_isolation_record_says_what_was_applied():
    r = run_program("import os\nprint(os.getuid(), os.getcwd(), sorted(os.listdir('.')))", timeout=5)
    assert r.passed
    iso = r.isolation
    assert iso["netns"] and iso["pidns"] and iso["mountns"] and iso["private_tmp"]
    uid, cwd, listing = r.stdout.split(" ", 2)
    assert int(uid) == iso["uid"] != 0
    assert cwd == iso["workdir"] and listing.strip() == "[]"  # an empty working directory


# ---------------------------------------------------------------- adversarial programs


def test_infinite_loop_times_out():
    t = time.monotonic()
    r = run_program("while True:\n    pass", timeout=2)
    assert r.status is Status.TIMEOUT and not r.passed
    assert time.monotonic() - t < 6


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


def test_allocating_50_gb_fails_and_leaves_the_caller_alive():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_program("x = bytearray(50 * 1024 ** 3)\nx[-1] = 1\nprint('allocated')", timeout=5, memory_mb=512)
    assert not r.passed and r.status in (Status.FAIL, Status.CRASH)
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr
    assert r.max_rss_mb is not None and r.max_rss_mb < 512
    assert os.getpid() and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # < ~100 MB growth here


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


@needs_root
def test_writing_and_deleting_outside_the_working_directory():
    d, files = _plant()
    tag = os.urandom(4).hex()
    escape = [f"/tmp/corp-escape-{tag}", f"/var/tmp/corp-escape-{tag}", f"/dev/shm/corp-escape-{tag}", os.path.join(d, "new.txt"), f"/work/corp-escape-{tag}", "/corp-escape-" + tag]
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
        r = run_program(_destroyer(d, files, []), timeout=5, namespaces=False)
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


def test_printing_100_mb_is_capped():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    src = "import sys\nline = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(line)\nsys.stdout.flush()\nraise AssertionError('printed')\n"
    r = run_program(src, timeout=10, max_output_bytes=65536)
    assert not r.passed and r.status is Status.FAIL
    assert r.truncated and len(r.stdout) == 65536 and "AssertionError" in r.stderr  # ran to the end, output capped
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000


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


def test_exit_before_the_asserts_is_not_a_pass():
    body = "def f():\n    return 1\n{exit}\nassert f() == 2\n"
    for exit_stmt in ("import sys; sys.exit(0)", "raise SystemExit", "import os; os._exit(0)", "exit()"):
        r = run_program(body.format(exit=exit_stmt), timeout=5)
        assert r.status is Status.FAIL and r.returncode == 0 and not r.passed, exit_stmt


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


def test_many_adversarial_programs_in_parallel_keep_order_and_counts():
    programs = ["while True: pass", "assert 1 == 2", "print(1)", "import sys; sys.exit(0)\nassert 0", "x = bytearray(50 * 1024 ** 3)", "print(2)"]
    results = run_many(programs, concurrency=2, timeout=2)
    assert [r.status for r in results] == [Status.TIMEOUT, Status.FAIL, Status.PASS, Status.FAIL, Status.FAIL, Status.PASS]
    assert results[2].stdout == "1\n" and results[5].stdout == "2\n"
    assert status_counts(results) == {"pass": 2, "fail": 3, "timeout": 1, "crash": 0, "sandbox_error": 0}
