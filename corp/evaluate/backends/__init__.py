"""Generation backends: `hf` (transformers; the reference) and, where installed, `vllm`."""

from __future__ import annotations

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
        from corp.extras import available

        return "vllm" if gpu and available("vllm") else "hf"
    return name


def make_backend(
    name: str,
    model: str | None,
    device: str = "cpu",
    dtype: str | None = None,
    batch_size: int = 64,
    param_filter=None,
    scheme: str | None = None,
) -> Backend:
    """`scheme`: the run's noise scheme (None: the current full-rank one)."""
    from corp.perturb import SCHEME_VERSION, lowrank_rank

    name = resolve_backend_name(name)
    scheme = scheme or SCHEME_VERSION
    if name == "hf":
        from corp.evaluate.backends.hf import HFBackend

        return HFBackend.from_model_name(
            model, device=device, dtype=dtype, batch_size=batch_size, param_filter=param_filter, scheme=scheme
        )
    if lowrank_rank(scheme) is not None:
        raise CorpError(f"--noise {scheme} (low-rank) is not supported on the vllm backend yet; pass --backend hf")
    from corp.extras import require

    require("vllm", "--backend vllm")  # a missing vLLM is one line; an ImportError inside vllm.py surfaces as itself
    from corp.evaluate.backends.vllm import VLLMBackend

    return VLLMBackend.from_model_name(model, dtype=dtype, param_filter=param_filter)


__all__ = ["Backend", "Generations", "BACKENDS", "make_backend", "resolve_backend_name"]
