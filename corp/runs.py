"""The run-directory contract (DESIGN.md, "Run directory").

`runs/<task>__<method>__<seed>__<timestamp>/` holds the resolved config, the population, metrics,
the report, the recipe and the saved model. Whole files are written atomically (temp + rename);
JSONL logs are appended and flushed one row at a time, and a torn last line (a kill mid-write)
is detected and dropped on the next read.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import yaml

from corp import CorpError


def run_name(task: str, method: str, seed: int) -> str:
    safe_task = task.replace(":", "-").replace("/", "-")
    return f"{safe_task}__{method}__{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(run_dir: str | Path | None, task: str, method: str, seed: int, root: str | Path = "runs") -> Path:
    """Create (or reopen, for resume) a run directory and check that it is writable."""
    path = Path(run_dir) if run_dir else Path(root) / run_name(task, method, seed)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise CorpError(f"run directory '{path}' is not writable ({exc.strerror}); pass a writable --run-dir") from None
    return path


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


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
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
    """Append one row and make it durable before returning (at most the row in flight is lost)."""
    with open(path, "a") as fh:
        fh.write(json.dumps(_jsonable(row)) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: str | Path, key: str | None = None, repair: bool = True) -> list[dict]:
    """Read a JSONL log written by `append_jsonl`.

    A last line that does not parse, or lacks `key`, is a torn write from an interrupted run: it is
    dropped (and, with `repair`, cut from the file so later appends start on a clean line). A bad
    line anywhere else is corruption and an error naming the file and line.
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
                    with open(path, "r+b") as fh:
                        fh.truncate(good_bytes)
                break
            raise CorpError(f"'{path}' line {i + 1} is not a valid row; the file is corrupt (move it away to start over)") from None
        rows.append(row)
        good_bytes += len(line) + 1
    return rows


def iter_lines_jsonl(path: str | Path) -> Iterable[tuple[int, dict]]:
    """Parse a user-supplied JSONL file strictly: a malformed line is an error naming file and line."""
    path = Path(path)
    if not path.exists():
        raise CorpError(f"data file '{path}' does not exist")
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpError(f"'{path}' line {lineno} is not valid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise CorpError(f"'{path}' line {lineno} is not a JSON object")
            yield lineno, row
