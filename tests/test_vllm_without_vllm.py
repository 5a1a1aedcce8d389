"""The parts of the vLLM backend that run without vLLM (the fast suite's check on these modules; their
agreement with the hf backend is `make test-vllm`'s): the engine's arguments on a CPU, the end-of-sequence
ids, the worker extension's import path, dropping vLLM's kept tracebacks."""

from __future__ import annotations

import sys
import types

import torch

from corp.evaluate.backends import vllm as vllm_backend
from corp.evaluate.backends.vllm_engine import EXTENSION, engine_kwargs, eos_ids, forget_import_tracebacks


def test_the_worker_extension_path_names_the_class_corp_defines():
    module, _, name = EXTENSION.rpartition(".")
    assert module == vllm_backend.__name__ and getattr(vllm_backend, name) is vllm_backend.CorpWorkerExtension


def test_engine_arguments_on_a_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CORP_VLLM_KV_GIB", "0.5")
    kw = engine_kwargs("/m", "bfloat16", 512, enforce_eager=True, tensor_parallel_size=1, gpu_memory_utilization=0.9)
    assert kw["model"] == "/m" and kw["worker_extension_cls"] == EXTENSION and kw["enforce_eager"] is True
    assert kw["kv_cache_memory_bytes"] == 2**29 and kw["enable_chunked_prefill"] is False
    assert kw["max_num_batched_tokens"] == 512 and "gpu_memory_utilization" not in kw  # no GPU: the fixed KV cache


def test_eos_ids_join_the_generation_config_and_the_tokenizer(tiny_dir, tiny_tokenizer):
    assert eos_ids(tiny_dir, tiny_tokenizer) == {tiny_tokenizer.eos_token_id}
    assert eos_ids(tiny_dir / "no-such-dir", tiny_tokenizer) == {tiny_tokenizer.eos_token_id}


def test_tracebacks_kept_by_vllm_modules_are_dropped_and_counted(monkeypatch):
    try:
        raise ImportError("no torchcodec")
    except ImportError as e:
        kept = e
    fake = types.ModuleType("vllm_fake_media")
    fake._import_exc = kept
    monkeypatch.setitem(sys.modules, "vllm_fake_media", fake)
    assert kept.__traceback__ is not None
    assert forget_import_tracebacks() >= 1
    assert kept.__traceback__ is None and str(fake._import_exc) == "no torchcodec"  # the message stays
