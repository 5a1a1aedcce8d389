"""Loading a model onto a device and dtype (`load_model`), and the checks of `--device` and `--dtype`."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from corp.errors import CorpError
from corp.runtime.models.cache import card_note
from corp.runtime.models.resolve import resolve_model

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
        # in the checkpoint's dtype on the cpu the parameters are the file as safetensors maps it (copy-on-write:
        # page cache until written); a cast tensor is a copy
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


def checkpoint_tensors(model_path: str | Path) -> dict:
    """Every tensor of the checkpoint, as safetensors maps them: copy-on-write views of the files, so
    a pristine base in the checkpoint's dtype is page cache, not process memory
    (corp.runtime.models.memory counts it so; a tensor cast to another dtype is a copy)."""
    from safetensors.torch import load_file

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise CorpError(
            f"model directory '{model_path}' has no .safetensors files; the vllm backend reloads weights from them"
        )
    out: dict = {}
    for f in files:
        out.update(load_file(f))
    return out
