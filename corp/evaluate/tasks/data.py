"""Where benchmark data files are found: `--data PATH`, then `$CORP_DATA_DIR`, then (for users with
a network and the `hub` extra) Hugging Face `datasets`, written once into corp's cache in the same
JSONL layout as the local files; otherwise one error line saying where to put the files.

The local files are the offline path (and CI's); see the shared data README for provenance. The
hub copies come from the datasets those files were published as (HUB_SOURCES), so the fields are
the same; their content hash is in every cached row like a local file's.
"""

from __future__ import annotations

import os
from pathlib import Path

from corp.errors import CorpError
from corp.extras import available, require
from corp.runtime.models import cache_dir, hub_offline
from corp.runtime.runs import atomic_write_text


def data_file(task: str, relative: str, data_dir: str | Path | None = None) -> Path:
    roots = [Path(p) for p in (data_dir, os.environ.get("CORP_DATA_DIR")) if p]
    for root in roots:
        for candidate in (root / relative, root / task / Path(relative).name, root / Path(relative).name):
            if candidate.is_file():
                return candidate
    looked = ", ".join(str(r / relative) for r in roots) or "nowhere: neither --data nor $CORP_DATA_DIR is set"
    if not roots and relative in HUB_SOURCES:
        return hub_file(task, relative, looked)
    raise CorpError(
        f"task '{task}' needs data file '{relative}'; looked in {looked}. Pass --data DIR or set CORP_DATA_DIR"
    )


# relative path -> (Hugging Face dataset id, config, splits concatenated in this order, sort key or None)
HUB_SOURCES: dict[str, tuple[str, str | None, tuple[str, ...], str | None]] = {
    "gsm8k/train.jsonl": ("openai/gsm8k", "main", ("train",), None),
    "gsm8k/test.jsonl": ("openai/gsm8k", "main", ("test",), None),
    "math500/test.jsonl": ("HuggingFaceH4/MATH-500", None, ("test",), None),
    # mbpp.jsonl is all 974 problems in task_id order; the hub splits them four ways
    "mbpp/mbpp.jsonl": ("google-research-datasets/mbpp", "full", ("train", "test", "validation", "prompt"), "task_id"),
    "humaneval/HumanEval.jsonl": ("openai/openai_humaneval", None, ("test",), None),
}


def hub_file(task: str, relative: str, looked: str) -> Path:
    """The data file from the Hugging Face hub, cached as JSONL under corp's cache (fetched once)."""
    import json

    out = cache_dir() / "data" / relative
    if out.is_file():
        return out
    if not available("datasets"):
        raise CorpError(
            f"task '{task}' needs data file '{relative}'; looked in {looked}. Pass --data DIR or set CORP_DATA_DIR, "
            "or install the hub extra (`pip install 'corp[hub]'`) to load it from Hugging Face"
        )
    name, config, splits, sort_key = HUB_SOURCES[relative]

    if hub_offline():  # one line now, not the datasets library's retries with backoff
        files = " and ".join(DATA_FILES.get(task, (relative,)))
        raise CorpError(
            f"task '{task}' needs {files}: neither --data nor $CORP_DATA_DIR is set, and the Hugging Face hub "
            f"is out of reach (offline) to load '{name}' from; put the files in DIR (layout: docs/commands.md, "
            "'--data DIR') and pass --data DIR or set CORP_DATA_DIR"
        )
    datasets = require("datasets", f"task '{task}' from the hub")
    try:
        rows = [dict(r) for split in splits for r in datasets.load_dataset(name, config, split=split)]
    except Exception as exc:  # offline, a renamed dataset, a hub error: one line, whatever the library raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CorpError(
            f"task '{task}' needs data file '{relative}': not found locally ({looked}) and loading '{name}' "
            f"from the Hugging Face hub failed ({first}). Pass --data DIR or set CORP_DATA_DIR"
        ) from None
    if sort_key:
        rows.sort(key=lambda r: r[sort_key])
    atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    return out


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
    return {
        "data_sha256": {
            rel: file_sha256(data_file(task.name, rel, getattr(task, "data_dir", None)))
            for rel in DATA_FILES[task.name]
        }
    }


# ---------------------------------------------------------------- user data files (jsonl, csv, parquet)


def read_records(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, record) for each record of a user data file, by extension: `.csv` (header row;
    line numbers count the header as line 1), `.parquet` (row numbers from 1), anything else JSON
    Lines. Every problem is one CorpError naming the file and, where there is one, the line."""
    path = Path(path)
    if not path.exists():
        raise CorpError(f"data file '{path}' does not exist")
    if path.is_dir():
        raise CorpError(f"data file '{path}' is a directory; name a .jsonl, .csv or .parquet file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    texts = _decode_lines(path, path.read_bytes())
    if suffix in (".csv", ".tsv"):
        return _read_csv(path, texts, "\t" if suffix == ".tsv" else ",")
    return _read_jsonl(path, texts)


def _decode_lines(path: Path, raw: bytes) -> list[str]:
    """The text lines of a CSV or JSON Lines file (a BOM on line 1 dropped); a line that is not
    UTF-8 is one CorpError naming its line, byte and column."""
    lines = raw.split(b"\n")
    texts = []
    for lineno, line in enumerate(lines, 1):
        try:
            texts.append(line.decode("utf-8-sig" if lineno == 1 else "utf-8"))
        except UnicodeDecodeError as exc:
            raise CorpError(
                f"'{path}' line {lineno} is not UTF-8 text (byte {line[exc.start]:#04x} "
                f"at column {exc.start + 1}); save the file as UTF-8"
            ) from None
    return texts


def _read_jsonl(path: Path, texts: list[str]) -> list[tuple[int, dict]]:
    """One JSON object per non-blank line, with its line number."""
    import json

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

    reader = csv.reader(
        [t + "\n" for t in texts], delimiter=delimiter
    )  # one item per physical line: reader.line_num is the line
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

    require("pyarrow", f"reading '{path}' (Parquet; or convert it to .jsonl or .csv)")
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise CorpError(f"'{path}' is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    return [(i, row) for i, row in enumerate(table.to_pylist(), 1)]
