"""Where benchmark data files are found: `--data PATH`, then `$CORP_DATA_DIR`, then an error.

Nothing is downloaded at run time (the hub is not reachable from the machines this runs on);
the message says where to put the files. See the shared data README for provenance.
"""

from __future__ import annotations

import os
from pathlib import Path

from corp import CorpError


def data_file(task: str, relative: str, data_dir: str | Path | None = None) -> Path:
    roots = [Path(p) for p in (data_dir, os.environ.get("CORP_DATA_DIR")) if p]
    for root in roots:
        for candidate in (root / relative, root / task / Path(relative).name, root / Path(relative).name):
            if candidate.is_file():
                return candidate
    looked = ", ".join(str(r / relative) for r in roots) or "nowhere: neither --data nor $CORP_DATA_DIR is set"
    raise CorpError(f"task '{task}' needs data file '{relative}'; looked in {looked}. Pass --data DIR or set CORP_DATA_DIR")


# ---------------------------------------------------------------- content hashes of data files

_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (cached per path, size and mtime: a rewritten file is hashed again)."""
    import hashlib

    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


# The files each benchmark task reads (relative to the data directory, as `data_file` takes them).
DATA_FILES: dict[str, tuple[str, ...]] = {
    "gsm8k": ("gsm8k/train.jsonl", "gsm8k/test.jsonl"),
    "math500": ("math500/test.jsonl",),
    "mbpp": ("mbpp/mbpp.jsonl",),
    "humaneval": ("humaneval/HumanEval.jsonl",),
}


def data_signature(task) -> dict:
    """{'data_sha256': {relative path: sha256}} for a file-backed benchmark task, for its
    `signature()`: rows scored on one version of a data file are never reused for another."""
    return {"data_sha256": {rel: file_sha256(data_file(task.name, rel, getattr(task, "data_dir", None))) for rel in DATA_FILES[task.name]}}


# ---------------------------------------------------------------- user data files (jsonl, csv, parquet)


def read_records(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, record) for each record of a user data file, by extension: `.csv` (header row;
    line numbers count the header as line 1), `.parquet` (row numbers from 1), anything else JSON
    Lines. Every problem is one CorpError naming the file and, where there is one, the line."""
    import json

    path = Path(path)
    if not path.exists():
        raise CorpError(f"data file '{path}' does not exist")
    if path.is_dir():
        raise CorpError(f"data file '{path}' is a directory; name a .jsonl, .csv or .parquet file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    texts = []
    for lineno, line in enumerate(lines, 1):
        try:
            texts.append(line.decode("utf-8-sig" if lineno == 1 else "utf-8"))
        except UnicodeDecodeError as exc:
            raise CorpError(f"'{path}' line {lineno} is not UTF-8 text (byte {line[exc.start]:#04x} at column {exc.start + 1}); save the file as UTF-8") from None
    if suffix in (".csv", ".tsv"):
        return _read_csv(path, texts, "\t" if suffix == ".tsv" else ",")
    out = []
    for lineno, line in enumerate(texts, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpError(f"'{path}' line {lineno} is not valid JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise CorpError(f"'{path}' line {lineno} is not a JSON object")
        out.append((lineno, row))
    return out


def _read_csv(path: Path, texts: list[str], delimiter: str) -> list[tuple[int, dict]]:
    import csv

    reader = csv.reader([t + "\n" for t in texts], delimiter=delimiter)  # one item per physical line: reader.line_num is the line
    out, header = [], None
    try:
        for row in reader:
            if header is None:
                header = [h.strip() for h in row]
                if not any(header):
                    raise CorpError(f"'{path}' line 1: a CSV file needs a header row naming its columns")
                continue
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise CorpError(f"'{path}' line {reader.line_num}: {len(row)} fields, the header has {len(header)}")
            out.append((reader.line_num, dict(zip(header, row))))
    except csv.Error as exc:
        raise CorpError(f"'{path}' line {reader.line_num}: not valid CSV ({exc})") from None
    return out


def _read_parquet(path: Path) -> list[tuple[int, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpError(f"reading '{path}' needs pyarrow; install it with `pip install pyarrow` (or convert the file to .jsonl or .csv)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise CorpError(f"'{path}' is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    return [(i, row) for i, row in enumerate(table.to_pylist(), 1)]
