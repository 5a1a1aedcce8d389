"""`--model` to a loadable directory (`resolve_model`): an alias, a local directory or a hub id, never
waiting on a hub that is not there (`hub_offline`); a missing model is one line (`check_model_reachable`)."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

from corp.errors import CorpError
from corp.runtime.models.cache import DEFAULT_MODEL
from corp.runtime.models.embedded import (
    ALIASES,
    EmbeddedGGUF,
    alias_name,
    convert_gguf,
    embedded_dir,
    embedded_gguf_path,
    is_converted,
    lookup_alias,
)

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_model_dir(path: str | Path) -> None:
    """One-line error, before any weights load, for a directory whose config.json is not a model
    config or whose weights are missing (transformers would raise a traceback deep inside)."""
    path = Path(path)
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise CorpError(
            f"model directory '{path}' has no config.json; point --model at a Hugging Face model directory"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpError(
            f"model directory '{path}': config.json is not valid JSON ({exc}); restore it or point --model elsewhere"
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise CorpError(
            f"model directory '{path}': config.json has no 'model_type'; it is not a Hugging Face model config"
        )
    names = [n for n in _WEIGHT_FILES if (path / n).is_file()]
    if not names and not any(path.glob("*.safetensors")):
        raise CorpError(
            f"model directory '{path}' has no weights (model.safetensors, "
            "pytorch_model.bin or shards); copy them in or point --model elsewhere"
        )
    for index in (n for n in names if n.endswith(".index.json")):
        try:
            shards = set(json.loads((path / index).read_text())["weight_map"].values())
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise CorpError(f"model directory '{path}': {index} is not a valid weight index") from None
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise CorpError(
                f"model directory '{path}' is missing weight shard(s) {', '.join(missing[:3])} named in {index}"
            )


_HUB_ANSWERED: dict[str, bool] = {}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_offline(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub is out of reach: HF_HUB_OFFLINE is set, or its endpoint
    (HF_ENDPOINT, default huggingface.co) takes no TCP connection within `timeout` seconds, name
    lookup included (checked once per process). A hub that does not answer sets HF_HUB_OFFLINE=1
    for the process, so the hub libraries fail at once instead of retrying with backoff."""
    if _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE")):
        return True
    import socket
    import threading
    from urllib.parse import urlsplit

    endpoint = _endpoint()
    if endpoint not in _HUB_ANSWERED:
        url = urlsplit(endpoint)
        host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
        answered: list[bool] = []

        def probe() -> None:
            try:
                socket.create_connection((host, port), timeout=timeout).close()
                answered.append(True)
            except OSError:
                answered.append(False)

        thread = threading.Thread(target=probe, daemon=True)  # a name lookup ignores socket timeouts
        thread.start()
        thread.join(timeout)
        _HUB_ANSWERED[endpoint] = bool(answered and answered[0])
    if _HUB_ANSWERED[endpoint]:
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"  # this process (and its workers) never waits on the hub again
    for module in ("huggingface_hub.constants", "datasets.config"):
        if module in sys.modules:
            sys.modules[module].HF_HUB_OFFLINE = True
    return True


def fetch_hint(hub_id: str) -> str:
    """How to get a hub model onto a machine, for an error line."""
    return (
        f"fetch it where the hub answers: `hf download {hub_id} --local-dir DIR`, then pass --model DIR "
        f"(or `huggingface-cli download {hub_id}` into the Hugging Face cache, then rerun as is)"
    )


_ANNOUNCED: set[str] = set()


def _announce_alias(name: str, hub_id: str) -> None:
    """Say once per process what a hub alias stands for (an embedded alias names its build in `corp models`)."""
    if name != hub_id and name not in _ANNOUNCED:
        _ANNOUNCED.add(name)
        print(f"model: {name} is {hub_id}", file=sys.stderr)


def _embedded_model(spec: EmbeddedGGUF) -> tuple[str, Path]:
    """An embedded alias: its converted HF directory, converting the GGUF the first time."""
    out = embedded_dir(alias_name(spec))
    out.parent.mkdir(parents=True, exist_ok=True)
    # one converter at a time (two processes started together on a fresh machine, `corp bench`'s
    # two task processes or two test workers, would write one directory at once); the check is
    # under the lock too, so nobody loads a directory another process is still writing
    with open(out.parent / f".{out.name}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
        if not is_converted(spec, out):
            gguf, assembled = embedded_gguf_path(spec)
            convert_gguf(gguf, out)
            if assembled:
                gguf.unlink(missing_ok=True)  # corp wrote it; the converted directory is all that is needed now
    return spec.hf_id, out


def _local_model(local: Path) -> tuple[str, Path]:
    """A path that exists: it must be a model directory."""
    if not local.is_dir():
        raise CorpError(
            f"--model '{local}' is a file; point it at a Hugging Face model directory (or use an alias, `corp models`)"
        )
    check_model_dir(local)
    return str(local.resolve()), local.resolve()


# the files of a hub snapshot a model load reads
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]


def _cached_snapshot(name: str, hub_id: str) -> tuple[str, Path] | None:
    """The hub model from the Hugging Face cache, without the network; None when it is not there."""
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(hub_id, local_files_only=True, allow_patterns=list(_HUB_PATTERNS))
        check_model_dir(path)
        _announce_alias(name, hub_id)
        return hub_id, Path(path)
    except CorpError:
        raise
    except Exception:
        return None


def _no_download_reason(download: bool) -> str | None:
    """Why a model missing from the cache is not downloaded (for the error line); None if it may be."""
    if not download or os.environ.get("CORP_ALLOW_DOWNLOAD", "1") != "1":
        return "downloads are off (CORP_ALLOW_DOWNLOAD=0)" if download else "this lookup does not download"
    if hub_offline():
        silent = _HUB_ANSWERED.get(_endpoint()) is False
        return f"the Hugging Face hub ({_endpoint()}) does not answer" if silent else "HF_HUB_OFFLINE is set"
    return None


def _download_snapshot(name: str, hub_id: str) -> tuple[tuple[str, Path] | None, str | None]:
    """(the downloaded model, None), or (None, why the download failed) for the error line."""
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(hub_id, etag_timeout=10, allow_patterns=list(_HUB_PATTERNS))
        check_model_dir(path)
        _announce_alias(name, hub_id)
        return (hub_id, Path(path)), None
    except CorpError:
        raise
    except Exception as exc:  # unknown id, gated, a network that fails halfway...
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        return None, f"downloading it failed ({type(exc).__name__}{': ' + first if first else ''})"


def resolve_model(name: str | None, download: bool = True) -> tuple[str, Path]:
    """Return (canonical model id, local HF directory) for `--model`, converting an embedded GGUF once.

    `download=False` never touches the network (used to try a recipe's candidate bases in turn).
    A hub model that is not in the cache is downloaded only when the hub answers (`hub_offline`);
    otherwise, or when the download fails, one error line names the hub id and how to fetch it."""
    name = name or DEFAULT_MODEL
    spec = lookup_alias(name)
    if isinstance(spec, EmbeddedGGUF):
        return _embedded_model(spec)
    hub_id = spec if isinstance(spec, str) else name
    local = Path(name).expanduser()
    if local.exists():
        return _local_model(local)
    _check_not_a_missing_path(name)
    found = _cached_snapshot(name, hub_id)
    if found is not None:
        return found
    what = (
        f"model '{name}' (alias of {hub_id}) not found: not"
        if isinstance(spec, str)
        else f"model '{name}' not found: not an alias ({', '.join(ALIASES)}), not a local directory, not"
    )
    reason = _no_download_reason(download)
    if reason is None:
        found, reason = _download_snapshot(name, hub_id)
        if found is not None:
            return found
    raise CorpError(f"{what} in the Hugging Face cache, and {reason}; {fetch_hint(hub_id)}")


def _path_like(name: str) -> bool:
    """Whether `--model NAME` is written as a path, not a hub id ("org/name": one slash, no prefix)."""
    return (
        name in (".", "..")
        or name.startswith(("/", "./", "../", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def _check_not_a_missing_path(name: str) -> None:
    """A path that is not there is a local directory the user meant, not a hub id to download."""
    if _path_like(name):
        raise CorpError(
            f"--model '{name}': directory '{Path(name).expanduser()}' does not exist; check the path, or pass an "
            "alias (`corp models`) or a hub id (ORG/NAME)"
        )


def check_model_reachable(name: str | None) -> None:
    """Before a run directory is made: a hub model that is neither on this machine nor downloadable
    is its one-line error now (an embedded alias or a local directory passes at once; while the hub
    answers, fetching is left to the model load)."""
    name = name or DEFAULT_MODEL
    if isinstance(lookup_alias(name), EmbeddedGGUF) or Path(name).expanduser().exists():
        return
    _check_not_a_missing_path(name)
    if os.environ.get("CORP_ALLOW_DOWNLOAD", "1") != "1" or hub_offline():
        resolve_model(name)  # in the cache, or the error line
