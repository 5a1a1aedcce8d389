"""The Ray executor: same population rows as the local executor, and a killed actor costs only a retry.

The worker replicas load a tiny random Llama saved as a real HF directory, so the actors build
their backend through the real path (`--model DIR` -> make_backend -> HFBackend) and score through
`score_one`, as in a real run; only the model is small.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from corp import CorpError  # noqa: E402
from corp.config import RandOptConfig, load_config  # noqa: E402
from corp.evaluate.scorer import ensure_population  # noqa: E402
from corp.runtime.context import TIMING_FIELDS, setup_run  # noqa: E402
from corp.runtime.models import save_model  # noqa: E402
from corp.runtime.runs import read_jsonl  # noqa: E402
from tests.conftest import make_char_tokenizer, make_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = make_char_tokenizer()
    path = tmp_path_factory.mktemp("model") / "tiny-llama"
    save_model(make_tiny_llama(tok, hidden=64), tok, path)
    return path


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    yield
    if ray.is_initialized():
        ray.shutdown()


def cfg_for(run_dir, model, **kw):
    base = dict(
        model=str(model),
        task="arith",
        population=8,
        sigmas="0.05,0.1",
        n_support=12,
        n_probe=0,
        n_validation=0,
        n_test=4,
        top_k="1,2",
        max_new_tokens=12,
        threads=1,
        run_dir=str(run_dir),
    )
    base.update(kw)
    return load_config(RandOptConfig, None, base)


def strip_timing(rows):
    return {r["key"]: {k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows}


def local_population(tmp_path, tiny_dir):
    return ensure_population(setup_run(cfg_for(tmp_path / "local", tiny_dir), "randopt"))


def population_in_background(ctx) -> tuple[threading.Thread, dict]:
    """`ensure_population(ctx)` on a thread (a test kills something mid-run); `out` gets its rows or error."""
    out: dict = {}

    def run():
        try:
            out["rows"] = ensure_population(ctx)
        except BaseException as exc:  # surfaced by the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def wait_rows(path: Path, n: int, timeout: float = 300) -> None:
    """Until `path` holds `n` population rows (or `timeout` seconds)."""
    deadline = time.time() + timeout
    while time.time() < deadline and not (path.exists() and len(read_jsonl(path, key="key", repair=False)) >= n):
        time.sleep(0.05)


def test_ray_two_workers_same_population_as_local(tmp_path, tiny_dir):
    local = local_population(tmp_path, tiny_dir)
    ctx = setup_run(cfg_for(tmp_path / "ray", tiny_dir, executor="ray", workers=2), "randopt")
    try:
        rows = ensure_population(ctx)
        ex = ctx.executor
        assert ex.name == "ray" and len(ex.actors) == 2
        assert len(set(ex.pids())) == 2, "two separate worker processes"
        assert ctx.backend.__class__.__name__ == "RemoteBackend"
        assert not ctx.backend.host_loaded, "scoring a population loads no model on the driver"
        # the backend contract on the driver: the workers' identity, log-probs forwarded, and one
        # line (not an AttributeError) for what lives only in the workers
        local_backend = setup_run(cfg_for(tmp_path / "local", tiny_dir), "randopt").backend
        assert (ctx.backend.name, ctx.backend.model_id, ctx.backend.weights_hash) == (
            "hf",
            local_backend.model_id,
            local_backend.weights_hash,
        )
        assert ctx.backend.logprobs(["1 + 2"], [[5, 6]])[0] == pytest.approx(
            local_backend.logprobs(["1 + 2"], [[5, 6]])[0], abs=1e-6
        )
        # direction algebra and the saved model run on the driver's host copy, loaded when first asked
        assert [n for n, _ in ctx.backend.perturber.params] == [n for n, _ in local_backend.perturber.params]
        assert ctx.backend.host_loaded and ctx.backend.model is not local_backend.model
    finally:
        ctx.executor.close()
    assert [r["key"] for r in rows] == [r["key"] for r in local], "same ranking"
    assert strip_timing(rows) == strip_timing(local), "identical rows (seed, sigma, rewards, answers, tokens)"
    on_disk = read_jsonl(tmp_path / "ray" / "population.jsonl", key="key")
    assert strip_timing(on_disk) == strip_timing(local)
    # resumable exactly as the local executor: a rerun on the same directory scores nothing
    ctx2 = setup_run(cfg_for(tmp_path / "ray", tiny_dir), "randopt")
    calls = []
    ctx2.executor = type(
        "Spy", (), {"map": lambda self, c, specs, split: calls.extend(specs) or iter(()), "close": lambda self: None}
    )()
    again = ensure_population(ctx2)
    assert calls == [] and strip_timing(again) == strip_timing(local)


@pytest.mark.slow
def test_killing_an_actor_mid_run_still_completes(tmp_path, tiny_dir):
    local_population(tmp_path, tiny_dir)
    ctx = setup_run(
        cfg_for(tmp_path / "ray", tiny_dir, executor="ray", workers=2, n_support=24, max_new_tokens=24), "randopt"
    )
    from corp.runtime.executors import get_executor

    ex = get_executor(ctx)
    victim = ex.pids()[1]
    worker, out = population_in_background(ctx)
    path = tmp_path / "ray" / "population.jsonl"
    wait_rows(path, 1, timeout=120)
    os.kill(victim, signal.SIGKILL)  # actor 1 is busy with its next specialist: that one is lost
    worker.join(300)
    try:
        assert "error" not in out, out.get("error")
        assert ex.retried >= 1 and ex.replaced >= 1, "Ray restarted the killed actor and retried its shard"
        assert victim not in ex.pids()
        counted = ctx.population_source["executor"]
        assert counted["actor_restarts"] >= 1 and counted["retried_shards"] >= 1, "the report counts the retries"
    finally:
        ex.close()
    rows = out["rows"]
    assert len(rows) == 8
    # the rows equal an uninterrupted local run on the same config
    local_long = ensure_population(
        setup_run(cfg_for(tmp_path / "local-long", tiny_dir, n_support=24, max_new_tokens=24), "randopt")
    )
    assert strip_timing(rows) == strip_timing(local_long)
    assert len(read_jsonl(path, key="key")) == 8, "each specialist written once"


def test_executor_options_are_checked(tmp_path, tiny_dir):
    with pytest.raises(CorpError, match="--executor"):
        cfg_for(tmp_path, tiny_dir, executor="dask")
    with pytest.raises(CorpError, match="--workers"):
        cfg_for(tmp_path, tiny_dir, executor="ray", workers=0)
    with pytest.raises(CorpError, match="--ray-address needs"):
        cfg_for(tmp_path, tiny_dir, ray_address="auto")


# the population methods take tens of seconds each on Ray: the fast suite runs randopt and one refusal (es)
@pytest.mark.parametrize(
    "name",
    ["randopt", "es"]
    + [pytest.param(n, marks=pytest.mark.slow) for n in ("score", "consolidate", "analyze-rank", "fedcorp", "grpo")],
)
def test_every_method_runs_on_ray_with_the_rows_of_a_local_run_or_refuses_first(name, tmp_path, tiny_dir):
    """Population methods score on 2 actors and give the local run's rows, recipe and model; a method
    that runs in one process (ES, the GRPO family, eval, ...) refuses in one line before any work."""
    from corp.methods import REGISTRY
    from tests.test_engines import _outcome, _weights
    from tests.test_methods import COMMON, STRONGER

    m = REGISTRY[name]
    options = {**m.smoke, **COMMON, **STRONGER.get(name, {}), "model": str(tiny_dir), "threads": 1}
    if m.config.local_only:
        with pytest.raises(CorpError, match=r"--executor ray: .*use --executor local"):
            load_config(m.config, None, {**options, "executor": "ray", "run_dir": str(tmp_path / "ray")})
        assert not (tmp_path / "ray").exists(), "refused before any work"
        return
    local = m(load_config(m.config, None, {**options, "run_dir": str(tmp_path / "local")}))
    ray_before = ray.is_initialized()
    remote = m(
        load_config(m.config, None, {**options, "run_dir": str(tmp_path / "ray"), "executor": "ray", "workers": 2})
    )
    assert _outcome(remote, tmp_path / "ray") == _outcome(local, tmp_path / "local")
    if m.model:
        assert _weights(tmp_path / "ray" / "model") == _weights(tmp_path / "local" / "model")
    assert ray.is_initialized() == ray_before, "a local Ray that corp started is stopped at the end of the run"


def test_a_local_ray_listens_on_loopback_only(monkeypatch):
    """Every listening socket of the Ray corp starts (GCS, raylet, agents, workers) is on loopback;
    a Ray that would listen beyond it is refused in one line naming the setting."""
    import contextlib

    from corp.runtime import ray_cluster

    assert not ray.is_initialized()
    # planted: Ray's own default (no single-node mode) listens on every interface: corp refuses
    monkeypatch.setattr(ray_cluster, "loopback", contextlib.nullcontext)
    with pytest.raises(CorpError, match=ray_cluster.LOOPBACK_ENV):
        ray_cluster.init_ray(ray, None, 1)
    assert not ray.is_initialized(), "the exposed Ray was stopped"
    monkeypatch.undo()
    assert ray_cluster.init_ray(ray, None, 1)
    try:
        actor = ray.remote(num_cpus=1)(type("Probe", (), {"pid": lambda self: os.getpid()})).remote()
        worker_pid = ray.get(actor.pid.remote())
        pids = ray_cluster.ray_pids(ray._private.worker._global_node)
        assert worker_pid in pids, "the workers are among the processes checked"
        import psutil

        listening = [
            (p, c.laddr.ip)
            for p in pids
            for c in psutil.Process(p).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert len({p for p, _ in listening}) >= 3, "GCS, raylet and a worker listen"
        assert ray_cluster.exposed_sockets(pids) == [], listening
        assert all(ray_cluster.is_loopback(ip) for _, ip in listening)
    finally:
        ray_cluster.stop_ray(ray)  # as corp stops a Ray it started: its processes and temp dir go too


def test_resources_are_checked_before_any_work_and_threads_match_what_ray_reserved(tmp_path, tiny_dir, monkeypatch):
    """More workers than free CPUs is one line before any actor starts; each actor's torch threads
    are the CPUs Ray reserved for it; GPU engines sit in a placement group, tensor_parallel_size GPUs
    per engine (its CPU form: a custom resource stands in for the GPU)."""
    from types import SimpleNamespace

    from corp.runtime import ray_cluster
    from corp.runtime.executors import RayExecutor, actor_resources

    with ray_cluster.loopback():
        ray.init(num_cpus=2, resources={"fake_gpu": 4}, include_dashboard=False, log_to_driver=False)
    try:
        cfg = cfg_for(tmp_path / "r", tiny_dir, executor="ray", workers=3, threads=1)
        with pytest.raises(CorpError, match=r"--workers 3 needs 3 CPU .* 2 free"):
            RayExecutor(cfg, 3)
        assert not [a for a in ray._private.state.actors().values() if a["State"] != "DEAD"], "no actor started"
        ex = RayExecutor(cfg_for(tmp_path / "r", tiny_dir, executor="ray", workers=1, threads=2), 1)
        try:
            assert ex.info["threads"] == 2 and ex.bundle == {"CPU": 2.0}
        finally:
            ex.close()
        deadline = time.time() + 60
        while ray.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
            time.sleep(0.2)  # a killed actor's CPUs come back shortly after
        # engines: hf on CUDA asks for one GPU; vLLM for tensor_parallel_size GPUs, in a placement group
        monkeypatch.setenv(ray_cluster.GPU_RESOURCE_ENV, "fake_gpu")
        hf = SimpleNamespace(threads=1, backend="hf", device="cuda", tensor_parallel_size=1)
        assert actor_resources(hf, 2, "x")[1] == {"CPU": 1.0, "fake_gpu": 1.0}
        vllm = SimpleNamespace(threads=1, backend="vllm", device="cuda", tensor_parallel_size=2)
        threads, bundle = actor_resources(vllm, 2, "x")
        assert bundle == {"CPU": 1.0, "fake_gpu": 2.0}
        with pytest.raises(CorpError, match=r"--workers 3 needs 6 fake_gpu"):
            ray_cluster.check_free(ray, 3, bundle)
        ray_cluster.check_free(ray, 2, bundle)
        pg = ray_cluster.placement_group(ray, 2, bundle)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        probe = ray.remote(lambda: ray.get_runtime_context().get_assigned_resources())
        got = ray.get(
            [
                probe.options(
                    num_cpus=1,
                    resources={"fake_gpu": 2},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                ).remote()
                for i in range(2)
            ]
        )
        assert [g.get("fake_gpu") for g in got] == [2.0, 2.0], "each engine holds its tensor-parallel GPUs"
        ray.util.remove_placement_group(pg)
    finally:
        ray.shutdown()


def test_a_lowrank_population_is_scored_factored_in_each_actor(tmp_path, tiny_dir):
    """Low-rank noise on hf: each actor scores whole factored groups (the local executor's groups),
    so the rows are the local factored rows, `scoring: "factored"` included."""
    kw = dict(noise="lowrank:r=1", population=6, batch_size=8, n_support=4)
    local = ensure_population(setup_run(cfg_for(tmp_path / "local", tiny_dir, **kw), "randopt"))
    assert all(r.get("scoring") == "factored" for r in local if r["seed"] is not None)
    ctx = setup_run(cfg_for(tmp_path / "ray", tiny_dir, executor="ray", workers=2, **kw), "randopt")
    try:
        from corp.runtime.executors import get_executor

        ex = get_executor(ctx)
        examples = ray.put(list(ctx.splits["support"]))
        shards, factored = ex._shards(ctx, [(s, 0.05) for s in range(6)], "support", examples)
        assert factored and len(shards) == 3 and all(len(s) == 2 for s in shards), "groups of 8 // 4 prompts"
        rows = ensure_population(ctx)
    finally:
        ctx.close()
    assert strip_timing(rows) == strip_timing(local)


def test_ray_address_from_the_environment_is_honoured_and_join_failures_name_their_cause(
    tmp_path, tiny_dir, monkeypatch
):
    """RAY_ADDRESS without --ray-address joins that cluster (Ray's convention), so a head that is not
    there is one line naming RAY_ADDRESS, not a ValueError; an auth failure names the token used."""
    import socket

    from corp.runtime.executors import RayExecutor
    from corp.runtime.ray_cluster import join_cause

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(CorpError, match=rf"RAY_ADDRESS '127.0.0.1:{port}'.*unset RAY_ADDRESS"):
        RayExecutor(cfg_for(tmp_path, tiny_dir, executor="ray"), 2)
    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    cause = join_cause(ConnectionError("RPC error: UNAUTHENTICATED: invalid authentication token"))
    assert "auth_token" in cause and "RAY_AUTH_TOKEN" in cause, cause


def test_free_resources_that_lag_a_finished_task_are_waited_for_not_refused():
    """Ray's view of free CPUs lags a task that has just ended (the bench scores a population right
    after its cell tasks): where the cluster holds enough in total, check_free waits for them; where
    it does not, it refuses at once. Before, the lag alone refused a run the cluster could hold."""
    from corp.runtime import ray_cluster

    class Lagging:
        def __init__(self, free_after: int):
            self.calls, self.free_after = 0, free_after

        def available_resources(self):
            self.calls += 1
            return {"CPU": 2.0 if self.calls > self.free_after else 1.0}

        def cluster_resources(self):
            return {"CPU": 2.0}

    lag = Lagging(free_after=3)
    ray_cluster.check_free(lag, 2, {"CPU": 1.0}, settle_s=10)
    assert lag.calls == 4
    small = Lagging(free_after=10**9)
    t0 = time.monotonic()
    with pytest.raises(CorpError, match=r"--workers 3 needs 3 CPU .* 1 free of 2"):
        ray_cluster.check_free(small, 3, {"CPU": 1.0}, settle_s=10)
    assert time.monotonic() - t0 < 1, "more than the cluster holds is refused without waiting"
    with pytest.raises(CorpError, match=r"--workers 2 needs 2 CPU"):
        ray_cluster.check_free(small, 2, {"CPU": 1.0}, settle_s=0.5)  # never freed: refused after the wait
