"""The parts of the vLLM backend that run without vLLM (the fast suite's check on these modules; their
agreement with the hf backend is `make test-vllm`'s): the engine's arguments on a CPU, the end-of-sequence
ids, the worker extension's import path, dropping vLLM's kept tracebacks."""

from __future__ import annotations

import sys
import types

import torch

from corp.runtime.backends import vllm as vllm_backend
from corp.runtime.backends.vllm_engine import EXTENSION, engine_kwargs, eos_ids, forget_import_tracebacks


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


def test_the_host_model_read_at_engine_start_is_let_go_before_the_engine_loads(tiny_dir, monkeypatch):
    """The engine's start reads names, hash and dtype from an HF model on the host; that model (7.1 GB
    of the 1.5B model in float32) must be gone when the engine loads its own copy, not held beside it
    (the selected parameters stayed in a local of the starting frame: a second model at the peak)."""
    import gc
    import weakref

    from corp.algorithms.perturb import selected_parameters

    held: list = []

    def recording(model, param_filter):
        chosen = selected_parameters(model, param_filter)
        held.extend(weakref.ref(p) for _, p in chosen)
        return chosen

    class Started(Exception):
        pass

    def llm(**kwargs):
        gc.collect()
        alive = sum(r() is not None for r in held)
        raise Started(alive)

    monkeypatch.setattr(vllm_backend, "selected_parameters", recording)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=llm))
    monkeypatch.setattr(vllm_backend, "resolve_model", lambda name: (str(tiny_dir), str(tiny_dir)))
    try:
        vllm_backend.VLLMBackend.from_model_name(str(tiny_dir))
    except Started as e:
        assert held and e.args[0] == 0, f"{e.args[0]} of {len(held)} host parameters alive at the engine's start"
    else:
        raise AssertionError("the engine was never started")
