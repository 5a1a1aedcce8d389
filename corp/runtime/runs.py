"""The run-directory contract (docs/architecture.md, "Run directory").

`runs/<task>__<method>__<seed>__<timestamp>/` holds the resolved config, the population, metrics,
the report, the recipe and the saved model. Whole files are written atomically (temp + rename);
JSONL logs are appended and flushed one row at a time, and a torn last line (a kill mid-write)
is detected and dropped on the next read. An append always starts on a fresh line, so a complete
last row that lost only its newline is neither joined to the next row nor dropped.

One process at a time writes a run directory: `RunLock` holds an exclusive `flock` on
`.corp.lock` (which names the holder's pid) for as long as the run is open; a second process gets
one error naming that pid. A run records its state in `run_status.json` (running, complete,
failed, interrupted); a failed run that computed nothing in a directory it created is removed
(`finish_run_dir`), any other failed run gets a `FAILED` file saying why, so a half-made run never
looks complete. `write_report` is the one report writer (schema `corp-report/1`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from corp.algorithms.stats import compare_paired, compare_paired_rewards, comparison_line
from corp.errors import CorpError, RunBusy
from corp.runtime.cachedir import shown_datasets
from corp.runtime.ledger import FLOPS_FORMULA, Ledger
from corp.runtime.threads import wait_setting

NAME_PART_MAX = 64  # characters of user input in a derived file name (a file name may hold 255 bytes)


def bounded_name(text: str, limit: int = NAME_PART_MAX) -> str:
    """`text` if it fits in `limit` characters (and bytes), else its first characters and a hash of
    all of it, so two long names that share a prefix stay apart (a `jsonl:` task on a deep path)."""
    if len(text.encode()) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    head = text.encode()[: limit - len(digest) - 1].decode(errors="ignore")
    return f"{head}-{digest}"


def run_name(task: str, method: str, seed: int) -> str:
    safe_task = bounded_name(task.replace(":", "-").replace("/", "-"))
    return f"{safe_task}__{bounded_name(str(method))}__{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(run_dir: str | Path | None, task: str, method: str, seed: int, root: str | Path = "runs") -> Path:
    """Create (or reopen, for resume) a run directory and check that it is writable."""
    return open_run_dir(run_dir, task, method, seed, root)[0]


def open_run_dir(
    run_dir: str | Path | None, task: str, method: str, seed: int, root: str | Path = "runs"
) -> tuple[Path, bool]:
    """(path, created): create or reopen a run directory, checking it is writable; `created` says
    whether this call made it (only then may a failed run remove it)."""
    path = Path(run_dir) if run_dir else Path(root) / run_name(task, method, seed)
    if path.exists() and not path.is_dir():
        raise CorpError(f"--output-dir '{path}' is a file, not a directory; pass a directory")
    if path.is_dir():
        check_run_dir_is_corps(path)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        check_writable(path, WRITE_PROBE + ".")
    except OSError as exc:
        raise CorpError(
            f"run directory '{path}' is not writable ({exc.strerror}); pass a writable --output-dir"
        ) from None
    return path, created


WRITE_PROBE = ".write-test"  # the prefix of the probe file `check_writable` writes into a run directory, then removes


def check_run_dir_is_corps(path: Path) -> None:
    """Refuse to reuse a non-empty directory corp did not make as a run directory: corp writes its
    config.yaml, population.jsonl and the rest there, over (or appended to) files of the same names,
    so a directory without a run's marks (`RUN_MARKS`) is the user's and stays untouched."""
    try:
        # another corp process opening the same new run writes its probe there before its lock
        empty = all(p.name.startswith(WRITE_PROBE) for p in path.iterdir())
    except OSError as exc:
        raise CorpError(
            f"run directory '{path}' cannot be read ({exc.strerror}); pass a readable --output-dir"
        ) from None
    if not empty and not any((path / name).is_file() for name in RUN_MARKS):
        raise CorpError(
            f"--output-dir '{path}' is a non-empty directory corp did not make (no {STATUS_FILE}), and a run "
            "would write its files over yours there; pass a new or empty directory, or a run directory corp made"
        )


def check_writable(folder: Path, prefix: str) -> None:
    """Write and remove a probe file in FOLDER (an OSError if it cannot be). The probe's name is this
    call's own (mkstemp): two processes check one folder at once (two bench processes, a population run
    both open), and with one shared name the first to finish removed the other's probe under it."""
    fd, probe = tempfile.mkstemp(dir=folder, prefix=prefix)
    try:
        os.write(fd, b"ok")
    finally:
        os.close(fd)
        os.unlink(probe)


LOCK_FILE = ".corp.lock"
STATUS_FILE = "run_status.json"
FAILED_FILE = "FAILED"
# what setup writes before anything is computed: a failed run holding only these computed nothing
SETUP_FILES = frozenset({LOCK_FILE, STATUS_FILE, FAILED_FILE, "config.yaml", "splits.json", "population_meta.json"})
# a directory holding one of these is a run directory corp made (its status and lock from setup on;
# the population's meta, for a run copied without them), so it may be resumed
RUN_MARKS = (STATUS_FILE, LOCK_FILE, "population_meta.json")


def holds_results(run_dir: str | Path) -> bool:
    """Whether a run directory holds anything beyond what setup writes (rows, a checkpoint, a report):
    only then may an interrupted run say that its work is saved there."""
    path = Path(run_dir)
    return path.is_dir() and any(p.name not in SETUP_FILES for p in path.iterdir())


def enclosing_run_dir(path: str | Path) -> Path | None:
    """The corp run directory `path` is in or is (it, or a parent, has a run status or lock file), else None."""
    p = Path(path).expanduser().resolve()
    for d in (p, *p.parents):
        if (d / STATUS_FILE).is_file() or (d / LOCK_FILE).is_file():
            return d
    return None


def try_flock(fh) -> bool:
    """Take an exclusive flock on an open file without waiting (released when it closes); False if held."""
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


class RunLock:
    """An exclusive lock on a run directory (`flock` on `.corp.lock`, released when the process dies).

    Re-entrant within one process (a library caller may open the same run twice; both are this
    process), exclusive across processes.
    """

    _held: dict[str, list] = {}  # real path -> [file object, count]

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_FILE
        self.key = os.path.realpath(self.path)
        self.held = False

    def acquire(self) -> RunLock:
        entry = RunLock._held.get(self.key)
        if entry is not None:
            entry[1] += 1
            self.held = True
            return self
        fh = open(self.path, "a+")
        if not try_flock(fh):
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise RunBusy(
                f"run directory '{self.path.parent}' is in use by another corp process "
                f"(pid {holder}); wait for it to finish or pass another --output-dir"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        RunLock._held[self.key] = [fh, 1]
        self.held = True
        return self

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        entry = RunLock._held.get(self.key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del RunLock._held[self.key]
            fcntl.flock(entry[0].fileno(), fcntl.LOCK_UN)
            entry[0].close()


def write_status(run_dir: str | Path, status: str, **info) -> None:
    write_json(
        Path(run_dir) / STATUS_FILE,
        {
            "status": status,
            "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "openmp": wait_setting(),
            **info,
        },
    )


def finish_run_dir(run_dir: str | Path, created: bool, error: BaseException | None) -> str:
    """Record how a run ended. Success: status complete, a stale FAILED file goes. Failure: if this
    invocation created the directory and it holds only setup files (nothing was computed), remove
    it; otherwise write FAILED (and the status) so the directory never looks complete.
    Returns what was done: complete | removed | failed | interrupted."""
    path = Path(run_dir)
    if not path.is_dir():
        return "removed"
    if error is None:
        (path / FAILED_FILE).unlink(missing_ok=True)
        write_status(path, "complete")
        return "complete"
    # a lost Ray head (corp.errors.HeadLost) is an interruption too: nothing is wrong with the run
    interrupted = isinstance(error, KeyboardInterrupt) or getattr(error, "interrupted", False) is True
    what = "interrupted" if interrupted else "failed"
    message = f"{type(error).__name__}: {error}".strip().rstrip(":")
    entries = {p.name for p in path.iterdir()}
    if created and entries <= SETUP_FILES:
        shutil.rmtree(path, ignore_errors=True)
        return "removed"
    verb = "was interrupted" if interrupted else "failed"
    try:  # FAILED first: on a nearly full disk the small file is the one that must get through
        atomic_write_text(
            path / FAILED_FILE,
            f"this run {verb} and is not complete: {message}\nrerun the same command with --output-dir {path} to resume\n",
        )
        write_status(path, what, error=message)
    except OSError as exc:  # the disk is full: say so, and let the run's own error be the one reported
        warnings.warn(
            f"could not record in '{path}' that the run {verb} ({exc.strerror}); its run_status.json still says running"
        )
    return what


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj


# a write that failed because of the machine, not a bug: a full disk or quota, a read-only file system
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
# Rust libraries' I/O errors: tokenizers "No space left on device (os error 28)", safetensors "Os { code: 28, ..."
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


def write_failure(exc: BaseException) -> str | None:
    """Why a write failed when the machine is to blame (WRITE_ERRNOS), from any library: an OSError's
    errno, or the "(os error N)" of a bare Exception from a Rust library (the tokenizers library
    raises `Exception: No space left on device (os error 28)`); None for anything else."""
    if isinstance(exc, OSError):
        return (exc.strerror or os.strerror(exc.errno)) if exc.errno in WRITE_ERRNOS else None
    m = _RUST_OS_ERROR.search(str(exc))
    code = int(m.group(1) or m.group(2)) if m else None
    return os.strerror(code) if code in WRITE_ERRNOS else None


@contextmanager
def naming(path: str | Path):
    """An OSError raised inside names `path` when it names no file (a failed write() or fsync() on an
    open file does not), so the one error line says where the disk was full."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_with(path, lambda f: f.write(text.encode()))


class _WriteRecorder:
    """A binary file whose failed write is remembered: a library that wraps the OSError in its own
    error (torch.save turns a full disk into RuntimeError "unexpected pos") loses its errno, and with
    it the one line that says the disk is full."""

    def __init__(self, fh):
        self.fh, self.error = fh, None

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def save_through(fh, write) -> None:
    """`write(file)` into the open binary file `fh`, then flush it to disk; a write the machine
    refused raises its own OSError, whatever error the library raised around it."""
    rec = _WriteRecorder(fh)
    try:
        write(rec)
        fh.flush()
        os.fsync(fh.fileno())
    except Exception as exc:
        if rec.error is not None and rec.error is not exc:
            raise rec.error from None
        raise


def atomic_write_with(path: str | Path, write) -> None:
    """Write `path` atomically (a temporary sibling of this process's own, fsync, rename) through
    `write(file)` on a binary file, e.g. `lambda f: torch.save(state, f)`: a full disk is an OSError
    naming `path` (one line at the CLI), and leaves the old file as it was."""
    path = Path(path)
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                save_through(fh, write)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CorpError(f"file '{path}' does not exist") from None
    except json.JSONDecodeError as exc:
        raise CorpError(f"file '{path}' is not valid JSON (line {exc.lineno}): {exc.msg}") from None


def write_yaml(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(_jsonable(obj), sort_keys=False))


def append_jsonl(path: str | Path, row: dict) -> None:
    """Append one row and make it durable before returning (at most the row in flight is lost).

    The row starts on a fresh line. If the file does not end with a newline, its last line is
    either a complete row that lost only its newline (kept: a newline is added before the new row)
    or a torn write from a kill (cut, as `read_jsonl` would), so the new row is never glued to it.
    """
    text = (json.dumps(_jsonable(row)) + "\n").encode()
    with naming(path), open(path, "ab+") as fh:
        # two processes may append to one log (`corp bench --methods` splits a task's cells, which share
        # the task's evaluation cache): one appender at a time, so none reads another's row in flight as torn
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # released when the file closes
        size = fh.seek(0, os.SEEK_END)
        if size > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.seek(0)
                data = fh.read()
                start = data.rfind(b"\n") + 1
                try:
                    complete = isinstance(json.loads(data[start:]), dict)
                except ValueError:
                    complete = False
                if complete:
                    text = b"\n" + text
                else:
                    fh.truncate(start)
        fh.seek(0, os.SEEK_END)
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _cut_torn_tail(path: Path, good_bytes: int) -> None:
    """Cut what follows the last good row, unless it has become whole rows meanwhile: an appender in
    another process may have been mid-write (it holds the file's flock while writing, so this waits)."""
    with open(path, "r+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # released when the file closes
        fh.seek(good_bytes)
        tail = fh.read()
        try:
            whole = tail.endswith(b"\n") and all(
                isinstance(json.loads(line), dict) for line in tail.split(b"\n") if line.strip()
            )
        except ValueError:
            whole = False
        if not whole:
            fh.truncate(good_bytes)


def read_jsonl(path: str | Path, key: str | None = None, repair: bool = True, unique: bool = False) -> list[dict]:
    """Read a JSONL log written by `append_jsonl`.

    A last line that does not parse, or lacks `key`, is a torn write from an interrupted run: it is
    dropped (and, with `repair`, cut from the file so later appends start on a clean line). A bad
    line anywhere else is corruption and an error naming the file and line. With `unique`, rows
    repeating an earlier row's `key` are collapsed to the first one (two writers, or a crash between
    a write and its bookkeeping, must never make a row count twice).
    """
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    rows: list[dict] = []
    good_bytes = 0
    for i, line in enumerate(lines):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        last = all(not rest.strip() for rest in lines[i + 1 :])
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or (key is not None and key not in row):
                raise ValueError("row without key")
        except ValueError:
            if last:
                if repair:
                    _cut_torn_tail(path, good_bytes)
                break
            raise CorpError(
                f"'{path}' line {i + 1} is not a valid row; the file is corrupt (move it away to start over)"
            ) from None
        rows.append(row)
        good_bytes += len(line) + 1
    if unique and key is not None:
        rows = list(unique_rows(rows, key).values())
    return rows


def unique_rows(rows: Iterable[dict], key: str = "key") -> dict[str, dict]:
    """{key: first row with that key}, in first-seen order."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r[key], r)
    return out


# ----------------------------------------------------------------------------- the one report writer

REPORT_SCHEMA = "corp-report/1"
OUTCOMES_FILE = "test_outcomes.json"


@dataclass
class ReportRow:
    """One row of a report: a model (or ensemble) evaluated on the test split.

    `correct` is the per-example outcome (0/1) on the test split, in split order, as a
    `corp.algorithms.stats.PerExample` (so comparisons can check they pair the same examples); it is written
    to `test_outcomes.json`. `labelled_examples` is how many labelled examples the method used to
    make its choices (RandOpt and ES: the support split; CoRP: support + probe + validation; the
    base: 0), so rows using different amounts of labelled data are never compared silently.
    `rewards` is the per-example test reward (a `PerExample`), what a report of a task without gold
    answers measures (`write_report(measure="reward")`).
    """

    method: str
    accuracy: float
    passes_per_example: int
    ledger: Ledger
    labelled_examples: int = 0
    correct: Sequence[int] | None = None
    detail: dict = field(default_factory=dict)
    rewards: Sequence[float] | None = None

    @property
    def reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def to_dict(self, measure: str = "accuracy") -> dict:
        led = self.ledger.to_dict()
        by_reward = measure == "reward"  # no gold answers: nothing was labelled; prompts were scored by the reward
        return {
            "method": self.method,
            "accuracy": self.accuracy,
            **({"reward": self.reward} if self.rewards is not None else {}),
            "passes_per_example": self.passes_per_example,
            "labelled_examples": 0 if by_reward else self.labelled_examples,
            **({"scored_prompts": self.labelled_examples} if by_reward else {}),
            "n": len(self.correct) if self.correct is not None else None,
            "ledger": led,
            **led,  # flat ledger keys: the pre-schema report layout, kept for readers of old reports
            **self.detail,
        }


def write_report(
    run_dir: str | Path,
    method: str,
    model: str,
    task: str,
    rows: Sequence[ReportRow],
    compare: Sequence[tuple[str, str]] = (),
    example_ids: Sequence[str] | None = None,
    measure: str = "accuracy",
    **extra,
) -> dict:
    """Write `report.json` (schema corp-report/1) and `test_outcomes.json`; return the report.

    Every pair (a, b) in `compare` gets the accuracy difference a - b on the shared test examples,
    its paired bootstrap 95% interval and the exact McNemar p (corp.algorithms.stats.compare_paired).
    `rows` appear under `rows` (and, for readers of the older layout, under `test`). `measure="reward"`
    (a task without gold answers, where accuracy means nothing): the pairs compare the rows' mean
    test rewards instead, and the report says so (`measure`).
    """
    run_dir = Path(run_dir)
    comparisons = paired_comparisons(rows, compare, measure)
    outcomes = {r.method: [int(c) for c in r.correct] for r in rows if r.correct is not None}
    if outcomes:
        write_json(
            run_dir / OUTCOMES_FILE,
            {"example_ids": list(example_ids) if example_ids is not None else None, "outcomes": outcomes},
        )
    table_rows = [r.to_dict(measure) for r in rows]
    report = {
        "schema": REPORT_SCHEMA,
        "method": method,
        "model": model,
        "task": shown_datasets(task),  # an API dataset by its name: a report is shared, config.yaml resumes
        "run_dir": str(run_dir),
        "n_test": len(example_ids) if example_ids is not None else None,
        "rows": table_rows,
        "test": table_rows,
        "comparisons": comparisons,
        "test_outcomes": OUTCOMES_FILE if outcomes else None,
        "flops_formula": FLOPS_FORMULA,
        **({"measure": measure} if measure != "accuracy" else {}),
        **extra,
    }
    write_json(run_dir / "report.json", report)
    return report


def paired_comparisons(rows: Sequence[ReportRow], compare: Sequence[tuple[str, str]], measure: str) -> list[dict]:
    """Each pair (a, b) whose rows both have per-example outcomes (or rewards, by reward): a - b, paired."""
    by_name = {r.method: (r.rewards if measure == "reward" else r.correct) for r in rows}
    compare_fn = compare_paired_rewards if measure == "reward" else compare_paired
    pairs = [(a, by_name.get(a), b, by_name.get(b)) for a, b in compare]
    return [compare_fn(*pair) for pair in pairs if pair[1] is not None and pair[3] is not None]


def format_rows(
    rows: Sequence[ReportRow],
    comparisons: Sequence[dict] = (),
    selection_flops: float | None = None,
    measure: str = "accuracy",
) -> str:
    """The printed table: accuracy, passes per example, labelled examples, tokens, FLOPs; then one line per
    comparison. `measure="reward"` (no gold answers): the mean test reward, 0 labelled and the prompts scored."""
    by_reward = measure == "reward"
    head = f"{'test reward':>11} {'passes/ex':>9} {'labelled':>8} {'scored':>6}" if by_reward else ""
    head = head or f"{'test acc':>8} {'passes/ex':>9} {'labelled':>8}"
    lines = [f"{'method':<22} {head} {'test tokens':>12} {'test FLOPs':>11}"]
    for r in rows:
        value = f"{r.reward if r.reward is not None else math.nan:>11.3f}" if by_reward else f"{r.accuracy:>8.3f}"
        used = f"{0:>8d} {r.labelled_examples:>6d}" if by_reward else f"{r.labelled_examples:>8d}"
        lines.append(
            f"{r.method:<22} {value} {r.passes_per_example:>9d} {used} "
            f"{r.ledger.inference_tokens:>12d} {r.ledger.flops:>11.3e}"
        )
    if by_reward:
        lines.append("(no gold answers: each row's mean test reward; scored: prompts its method scored by the reward)")
    if selection_flops is not None:
        lines.append(
            f"(population scoring on the support split: {selection_flops:.3e} FLOPs, shared by every non-base row)"
        )
    lines.extend(comparison_line(c) for c in comparisons)
    lines.append(FLOPS_FORMULA)
    return "\n".join(lines)
