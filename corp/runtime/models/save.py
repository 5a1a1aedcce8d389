"""Saving a model (`save_model`: a temporary sibling renamed into place, a marker file, leftovers of
killed saves cleaned up) and the check of where it may go (`check_output_dir`: never over what corp
did not write)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from corp.errors import CorpError
from corp.runtime.models.cache import CARD_FILE, MARKER, SOURCE_FILE, is_corp_model
from corp.runtime.runs import LOCK_FILE, STATUS_FILE, write_failure
from corp.version import __version__


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_output_dir(out: str | Path, overwrite: bool = False, protect: dict[str, str | Path] | None = None) -> Path:
    """Where a model may be written; one-line errors for a target that would destroy other files.

    Refused always: a file, a symbolic link, the current directory or one of its parents, and any
    path in `protect` (label -> path), or one inside it or above it, and a directory holding a run
    directory or a file outside every corp model (`_not_a_corp_model`). Refused without `overwrite`:
    a non-empty directory that has no corp marker itself. Returns the absolute target."""
    given = Path(out).expanduser()
    if given.is_symlink():
        raise CorpError(f"output '{out}' is a symbolic link; name a real directory")
    target = given.resolve()
    if target.exists() and not target.is_dir():
        raise CorpError(f"output '{out}' is a file; name a directory to write the model into")
    above = next((p for p in target.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise CorpError(
            f"output '{out}' lies under '{above}', which is a file; name a directory to write the model into"
        )
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise CorpError(
            f"output '{out}' is the current directory or one of its parents; name a new directory for the model"
        )
    for label, path in (protect or {}).items():
        path = Path(path).expanduser().resolve()
        if _overlaps(target, path):
            raise CorpError(
                f"output '{out}' overlaps {label} ('{path}'); writing there would replace it, so name another directory"
            )
    if target.is_dir():
        foreign = _not_a_corp_model(target)
        if foreign is not None:
            what = "the run directory" if foreign[1] == "run" else "a file corp did not write"
            raise CorpError(
                f"output '{out}' holds {what} '{foreign[0]}' (corp replaces only model directories it wrote, "
                f"marked by {MARKER}); nothing was deleted: name another directory or move it away"
            )
        if not overwrite and not is_corp_model(target) and any(target.iterdir()):
            raise CorpError(
                f"output '{out}' is a non-empty directory that corp did not write (no {MARKER}); "
                "name another directory, or pass --overwrite to replace the corp models in it"
            )
    return target


def _not_a_corp_model(target: Path) -> tuple[Path, str] | None:
    """(path, "run" | "file") of the first thing under `target` that is not part of a model directory
    corp wrote: a run directory anywhere (even inside a corp model: a copied run), or a file or link
    outside every directory with the marker. None when replacing `target` deletes only corp's models
    (and empty directories); `--overwrite` never widens this."""

    unreadable: list[OSError] = []  # a directory it cannot list may hold anything: refused as unknown
    for d, dirs, files in os.walk(target, onerror=unreadable.append):
        if unreadable:
            break
        here = Path(d)
        if STATUS_FILE in files or LOCK_FILE in files:
            return here, "run"
        links = [n for n in dirs if (here / n).is_symlink()]
        # in corp's model only the files it wrote go with it; anything else (a user's notes, a
        # subdirectory's files: a model has none) is refused like a file outside every model
        wrote = _model_files(here) if is_corp_model(here) else None
        theirs = sorted(n for n in files + links if n in links or wrote is None or not wrote(n))
        if theirs:
            return here / theirs[0], "file"
    return (Path(unreadable[0].filename), "file") if unreadable else None


# What a model directory written by an older corp (a marker without its list of files) may hold:
# the names `save_pretrained` and the tokenizers write, the card and corp's own files.
_HF_NAMES = re.compile(
    r"^(config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json"
    r"|tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)"
    r"|merges\.txt|chat_template\.(jinja|json))$"
)
_CARD_TEMP = re.compile(rf"^\.{re.escape(CARD_FILE)}(\..+)?\.tmp$")  # a card write killed before its rename


def _model_files(model_dir: Path):
    """A test `name -> bool`: whether corp wrote `name` in the model directory `model_dir`: a name the
    marker lists (`_write_model` records them), its card, the marker itself; for a marker without
    the list (an older corp), a name Hugging Face's save writes."""
    try:
        listed = json.loads((model_dir / MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    own = {MARKER, CARD_FILE, SOURCE_FILE}
    if isinstance(listed, list) and all(isinstance(n, str) for n in listed):
        names = own | set(listed)
        return lambda n: n in names or bool(_CARD_TEMP.match(n))
    return lambda n: n in own or bool(_HF_NAMES.match(n) or _CARD_TEMP.match(n))


PARTIAL = ".corp-partial"  # inside a save's temporary directory while it is being written: {"pid", "host"}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_saves(target: Path) -> None:
    """Leftovers of killed saves beside `target`, to any name (module docstring): a save killed while
    writing `a` is cleaned up by the next save into the same directory, whatever it writes."""
    import socket

    host = socket.gethostname()
    pattern = re.compile(r"^\.(.+)\.(tmp|old)-(\d+)-[A-Za-z0-9_]+$")
    if not target.parent.is_dir():
        return
    for p in sorted(target.parent.iterdir()):
        m = pattern.match(p.name)
        if not m or not p.is_dir() or p.is_symlink() or _pid_alive(int(m.group(3))) or int(m.group(3)) == os.getpid():
            continue
        dest = target.parent / m.group(1)  # the model that save was writing
        if m.group(2) == "tmp":
            if (p / PARTIAL).is_file():
                try:
                    mark = json.loads((p / PARTIAL).read_text())
                except (OSError, ValueError):
                    mark = None
                ours = isinstance(mark, dict) and mark.get("host") == host  # a pid means nothing on another host
            else:
                ours = (p / MARKER).is_file()  # written in full, killed before the rename
            if ours:
                shutil.rmtree(p, ignore_errors=True)
        elif not dest.exists():
            os.replace(p, dest)  # killed between moving the old model aside and putting the new one in place
        elif is_corp_model(dest):
            shutil.rmtree(p, ignore_errors=True)  # the new model is in place; the old one was to be deleted


def _temporary_dir(target: Path) -> Path:
    """The empty sibling a save writes into (after cleaning up killed saves beside it); an unwritable
    location is one line."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CorpError(
            f"cannot create the directory '{target.parent}' for the model ({exc.strerror}); name a writable location"
        ) from None
    _remove_stale_saves(target)
    try:
        return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-{os.getpid()}-"))
    except OSError as exc:
        raise CorpError(
            f"cannot write the model next to '{target}' ({exc.strerror}); name a writable location"
        ) from None


def _write_model(
    tmp: Path, target: Path, model, tokenizer, extra_files: dict[str, str] | None, source: dict | None
) -> None:
    """Everything the model directory holds, into `tmp` (marked partial until complete); a full disk
    or another write error is one line, with nothing replaced."""
    import socket

    try:
        (tmp / PARTIAL).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        files = sorted(p.name for p in tmp.iterdir() if p.name != PARTIAL)  # what a later save may replace
        (tmp / MARKER).write_text(
            json.dumps({"written_by": "corp", "corp_version": __version__, **(source or {}), "files": files}, indent=2)
            + "\n"
        )
        (tmp / PARTIAL).unlink()
    except Exception as exc:
        if not _is_write_error(exc):
            raise
        raise CorpError(
            f"could not write the model to '{target}': {_first_line(exc)}; "
            "nothing was replaced (free some space and run it again)"
        ) from None


def save_model(
    model,
    tokenizer,
    out: str | Path,
    extra_files: dict[str, str] | None = None,
    overwrite: bool = False,
    protect: dict[str, str | Path] | None = None,
    source: dict | None = None,
) -> Path:
    """Save a normal HF directory (safetensors, config, tokenizer, `extra_files`, the corp marker).

    Written into a temporary sibling, then renamed into place; an existing target (a corp model,
    or with `overwrite` a directory of corp models, see `check_output_dir`) is moved aside first and deleted only once
    the new one is in place, so an interrupted save leaves either the old or the new model."""
    target = check_output_dir(out, overwrite, protect)
    tmp = _temporary_dir(target)
    old: Path | None = None
    try:
        _write_model(tmp, target, model, tokenizer, extra_files, source)
        if target.exists():
            old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-{os.getpid()}-"))
            os.replace(target, old)  # onto an empty directory: allowed by rename(2)
        try:
            os.replace(tmp, target)
        except BaseException:  # Ctrl-C too: the old model goes back, it is never deleted without a new one
            if old is not None:
                os.replace(old, target)
                old = None
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def _is_write_error(exc: BaseException) -> bool:
    """An OSError, safetensors' own error for one, or any library's full disk: the tokenizers library
    raises a bare `Exception: No space left on device (os error 28)` (`corp.runtime.runs.write_failure`)."""

    return (
        isinstance(exc, OSError)
        or write_failure(exc) is not None
        or (type(exc).__name__ == "SafetensorError" and ("Io" in str(exc) or "os error" in str(exc).lower()))
    )


def _first_line(exc: BaseException) -> str:

    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if write_failure(exc):
        return write_failure(exc)
    m = re.search(
        r'message: "([^"]+)"', str(exc)
    )  # safetensors: IoError(Os { code: 28, ..., message: "No space left on device" })
    text = m.group(1) if m else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text[:200]
