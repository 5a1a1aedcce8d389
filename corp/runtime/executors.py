"""Executors: where population scoring runs. `local` (in this process, the default) or `ray`.

Population scoring is embarrassingly parallel over specialists. Both executors produce each row
with the same functions (`corp.runtime.context.score_one`, or `corp.runtime.batched.score_factored`
for a low-rank population on hf) and the driver alone appends rows to `population.jsonl`, so a Ray
population is resumable exactly like a local one and its rows are identical up to timing fields.

`ray`: one actor per worker, each holding its own backend replica built from the run's config
(`make_backend`, the same path as the local executor), with the CPUs (`--threads`, its torch threads)
and GPUs it asks Ray for; vLLM engines with GPUs sit in a placement group, one bundle of
`--tensor-parallel-size` GPUs per engine. Work goes out in shards: one specialist, or one factored
group (the local executor's groups, so the batched rows are the same). Where the cluster comes
from, what is checked before any work (loopback, free resources, the paths each node needs) and
how a lost head is noticed: `corp.runtime.ray_cluster`.

Faults are Ray's: actors restart (`max_restarts`) and a call in flight on an actor that died is
retried on its replacement (`max_task_retries`); the replacement catches up on the driver's state
(moves of the base, current direction) that each call carries, so a retried shard gives the same
rows. The driver counts restarts and retries (a shard's answer from a process other than the one
that answered that actor before) and they go in the population's report (`executor` in `source`).
A node lost with no room left for its actors: the pool shrinks to the live actors and their shards
go to the others (Ray would wait for resources forever). A head lost: one line (`HeadLost`), the
run is recorded as interrupted, and a rerun resumes from the rows written.

Where this departs from the usual Ray pattern (`ray.get` over a list of remote calls) and why:
results are consumed as they complete (`ray.wait`) and written at once, so a kill of the driver
loses at most what is in flight, as with the local executor. The driver does not load a model
of its own: `ctx.backend` becomes a proxy to actor 0, which serves the few calls made outside the
population (test-split evaluations, the weights hash that keys the population's meta).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

from corp.algorithms.perturb import ParamFilter
from corp.errors import CorpError, HeadLost
from corp.evaluate.rewards import resolve_reward
from corp.evaluate.tasks import get_task
from corp.extras import require
from corp.runtime.backends import make_backend, resolve_backend_name
from corp.runtime.backends.batched_lowrank import prompt_layout
from corp.runtime.backends.host import HostCopy
from corp.runtime.batched import factored_for, score_factored
from corp.runtime.context import RunContext, engine_options, run_scheme, score_one
from corp.runtime.ray_cluster import (
    GPU_RESOURCE_ENV,
    HeadWatch,
    check_free,
    check_nodes_have,
    forwarded_env,
    init_ray,
    node_paths,
    placement_group,
    stop_ray,
    warn_oversubscribed,
)

EXECUTORS = ("local", "ray")
MAX_RESTARTS = 3  # Ray restarts a dead actor this many times; then its shards go to the other actors
MAX_TASK_RETRIES = 3  # a call in flight on an actor that died is retried this many times on its replacement
STRANDED_S = 5.0  # an actor restarting this long with no room for it in the cluster is taken out of the pool
POLL_S = 0.5  # how often the driver looks at the head and the actors while it waits for rows


class LocalExecutor:
    name = "local"

    def map(self, ctx, specialists: Sequence[tuple[int | None, float | None]], split: str) -> Iterator[dict]:

        if specialists and factored_for(ctx) is not None:  # low-rank noise on hf: one batched pass, no weights written
            yield from score_factored(ctx, specialists, split)
            return
        specialists = list(specialists)
        for i, (seed, sigma) in enumerate(specialists):
            following = specialists[i + 1] if i + 1 < len(specialists) else None
            yield score_one(ctx, seed, sigma, split, following=following)

    def close(self) -> None:
        pass

    def stats(self) -> dict:
        return {}


class _Worker:
    """A Ray actor's body: a backend replica and the task; scores one specialist, or one group of
    specialists in a factored pass, per call.

    Its state beyond the config is the moves of the base (ES's centre) so far. Each call carries
    the list of all moves (an object-store reference), and the actor applies the ones it has not:
    an actor that Ray restarts (`max_restarts`) starts from the base and catches up on its first
    call, so a retried call (`max_task_retries`) runs on the same weights as the first try."""

    def __init__(self, cfg, threads: int | None, cwd: str | None = None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        if cwd and os.path.isdir(cwd):  # relative paths in rows' inputs resolve as on the driver
            os.chdir(cwd)
        task = get_task(cfg.task, cfg.data)
        pf = ParamFilter(getattr(cfg, "include", ".*"), getattr(cfg, "exclude", ""))
        backend = make_backend(
            cfg.backend, cfg.model, cfg.device, cfg.dtype, cfg.batch_size, pf, run_scheme(cfg), engine_options(cfg)
        )
        self.ctx = RunContext(cfg, "worker", task, {}, None, resolve_reward(cfg.reward), backend)
        self.applied = 0  # moves of the base applied in this process
        self.version = 0  # the driver's direction this process has (0: the base)

    def _catch_up(self, moves) -> None:
        for comps in (moves or [])[self.applied :]:
            self.ctx.backend.move_base(comps)
            self.applied += 1

    def info(self) -> dict:
        import ray

        b = self.ctx.backend
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "model_path": str(getattr(b, "model_path", None) or "") or None,
            "model_id": self.ctx.model_id,
            "n_params": b.n_params,
            "weights_hash": self.ctx.weights_hash,
            "name": b.name,
            "capabilities": sorted(b.capabilities),
            "threads": __import__("torch").get_num_threads(),
        }

    def factored_group(self, split, examples) -> int | None:
        """Specialists per factored group on `split` (the local executor's grouping), None when this
        run's population is scored one specialist at a time."""

        factored = factored_for(self.ctx)
        if factored is None:
            return None
        if hasattr(factored, "generations"):  # vLLM multi-LoRA: a group fills the engine's adapter slots
            return max(1, factored.group)
        return max(1, prompt_layout(self.ctx.backend, [e.prompt for e in examples])[3])

    def score(self, specialists, split, examples, moves=None, factored=False) -> tuple[int, list[dict]]:
        """(this process's pid, the rows of `specialists` on `split`)."""

        self._catch_up(moves)
        self.version = -1  # scoring leaves some specialist's weights in place
        self.ctx.splits[split] = examples
        if factored:
            rows = list(score_factored(self.ctx, specialists, split))
        else:
            rows = [score_one(self.ctx, seed, sigma, split) for seed, sigma in specialists]
        return os.getpid(), rows

    def _follow(self, moves, version, direction) -> None:
        """Take the driver's state: its moves of the base and its current direction (by version)."""
        self._catch_up(moves)
        if version != self.version:
            self.ctx.backend.set_direction(direction)
            self.version = version

    def generate(self, moves, version, direction, *args, **kwargs):
        self._follow(moves, version, direction)
        return self.ctx.backend.generate(*args, **kwargs)

    def logprobs(self, moves, version, direction, *args, **kwargs):
        self._follow(moves, version, direction)
        return self.ctx.backend.logprobs(*args, **kwargs)

    def close(self) -> None:
        """The backend let go in this process: what it keeps outside memory goes with it (a vLLM engine's
        merged-term files, gigabytes each at 1.5B), which a killed actor would leave behind."""
        self.ctx.backend.close()


class RemoteBackend(HostCopy):
    """`ctx.backend` on a Ray driver: generation goes to the executor's first live actor; direction
    algebra, the saved model and log-probabilities run on corp's host copy of the weights on the
    driver (`HostCopy`, loaded on first use: a run that only scores a population never loads it).
    It keeps the actor backend's name, model id, size and weights hash. The current direction is
    sent with each call (by version), so an actor that Ray restarted in between still has it."""

    instead = "run it with --executor local"

    def __init__(self, executor: RayExecutor, info: dict, host_spec: dict):
        self.executor = executor
        self.name = info["name"]
        self.model_id = info["model_id"]
        self.n_params = info["n_params"]
        self.weights_hash = info["weights_hash"]
        self.model_path = info.get("model_path")
        self.host_spec = host_spec
        self.version = 0  # 0: the base

    def describe(self) -> str:
        return f"the Ray driver (--executor ray: the '{self.name}' backend runs in the workers)"

    def _engine_set_direction(self, direction) -> None:
        self.version += 1
        self._engine_direction = direction

    def _state(self):
        # (moves, version, direction): the moves' reference goes as a top-level argument, which Ray resolves
        return (self.executor.moves_ref(), self.version, getattr(self, "_engine_direction", None))

    def _engine_move_base(self, components) -> None:
        self.executor.move_base(components)

    def _engine_set_base(self, state) -> None:
        raise CorpError("--executor ray scores populations; a method that trains the model runs with --executor local")

    def generate(self, *args, **kwargs):
        return self.executor.call_first("generate", *self._state(), *args, **kwargs)

    def close(self) -> None:
        HostCopy.close(self)


class RayExecutor:
    name = "ray"

    def __init__(self, cfg, workers: int, address: str | None = None):

        ray = require("ray", "--executor ray")
        # RAY_ADDRESS is Ray's own way to name a cluster: honoured as --ray-address
        origin = "--ray-address" if address else "RAY_ADDRESS"
        address = address or os.environ.get("RAY_ADDRESS") or None
        self.ray, self.workers, self.address = ray, workers, address
        self._threads, _ = actor_resources(cfg, workers, address)
        self._restarting: dict[int, float] = {}  # slot -> since when Ray reports it RESTARTING
        self._sent: dict[int, float] = {}  # slot -> when its shard in flight was sent
        if not (address or ray.is_initialized()):  # a Ray corp starts here: its CPUs are this machine's
            warn_oversubscribed(workers, self._threads)
        self.started_ray = init_ray(ray, address, None if address else workers * self._threads, origin)
        gpu_name = os.environ.get(GPU_RESOURCE_ENV, "GPU")
        _, bundle = actor_resources(cfg, workers, address, ray.cluster_resources().get(gpu_name, 0.0))
        self.bundle = bundle
        self.retried = 0  # shards Ray ran again on a restarted actor
        self.replaced = 0  # actor restarts seen (a shard answered by another process of the same actor)
        self.moved: list[list] = []  # every move_base so far, replayed by restarted actors
        self._moves_ref = None
        self.actors: list = []
        self.pg = None
        self.watch = HeadWatch(None)
        try:
            self._start(cfg, bundle)
        except BaseException:
            self.close()
            raise

    def _start(self, cfg, bundle) -> None:
        ray = self.ray
        check_free(ray, self.workers, bundle)
        changes, paths = node_paths(cfg)
        check_nodes_have(ray, paths)
        self.cfg = _replace(cfg, changes)
        gpu = {k: v for k, v in bundle.items() if k != "CPU"}
        options = dict(
            num_cpus=bundle["CPU"],
            max_restarts=MAX_RESTARTS,
            max_task_retries=MAX_TASK_RETRIES,
            runtime_env={"env_vars": forwarded_env()} if forwarded_env() else None,
        )
        if gpu:  # engines on GPUs: one bundle per engine, its GPUs on one node
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            self.pg = placement_group(ray, self.workers, bundle)
            ((res, amount),) = gpu.items()
            options.update({"num_gpus": amount} if res == "GPU" else {"resources": {res: amount}})
        cls = ray.remote(_Worker)
        self.actors = []
        for i in range(self.workers):
            opts = dict(options)
            if self.pg is not None:
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)
            self.actors.append(cls.options(**opts).remote(self.cfg, self._threads, os.getcwd()))
        self.alive = list(range(self.workers))  # slots still in the pool
        try:  # every actor loaded: its first process is known, so a restart is seen even before its first shard
            infos = ray.get([a.info.remote() for a in self.actors])
        except ray.exceptions.RayActorError as exc:
            raise CorpError(f"the Ray worker could not load the backend: {actor_cause(exc)}") from None
        self.info = infos[0]
        self.last_pid = {slot: info["pid"] for slot, info in enumerate(infos)}
        self.watch = HeadWatch(_gcs_address(ray))

    def moves_ref(self):
        if self._moves_ref is None:
            self._moves_ref = self.ray.put(list(self.moved))
        return self._moves_ref

    def move_base(self, components) -> None:
        """Every actor's base moves by `components` (ES's centre), as the driver's host copy does:
        each actor applies it with its next call (a restarted one replays every move, same bits)."""
        self.moved.append(list(components))
        self._moves_ref = None

    def pids(self) -> list[int]:
        return [self.ray.get(self.actors[s].info.remote())["pid"] for s in self.alive]

    def stats(self) -> dict:
        """What the report says about the executor: workers, Ray's restarts of its actors (from the
        GCS; the restarts the driver saw when it does not answer) and the shards run again."""
        counted = _bounded(lambda: sum(_actor_info(self.ray, a).get("NumRestarts", 0) for a in self.actors))
        return {
            "executor": "ray",
            "workers": self.workers,
            "workers_alive": len(self.alive),
            "threads_per_worker": self._threads,
            "actor_restarts": max(counted or 0, self.replaced),
            "retried_shards": self.retried,
        }

    def _get(self, ref):
        """ray.get that gives up when the head is lost (Ray's own driver would spin for a minute)."""
        ray = self.ray
        while True:
            ready, _ = ray.wait([ref], timeout=POLL_S)
            if ready:
                return ray.get(ref)
            self._check_head()

    def _check_head(self) -> None:
        if self.watch.lost:
            raise HeadLost(
                f"the Ray head ({self.watch.gcs_address}) stopped answering mid-run; the rows scored so far are "
                "kept: restart the cluster and rerun the same command to resume"
            )

    def call_first(self, method: str, *args, **kwargs):
        ray = self.ray
        while self.alive:
            slot = self.alive[0]
            try:
                return self._get(getattr(self.actors[slot], method).remote(*args, **kwargs))
            except ray.exceptions.RayActorError as exc:
                self._drop(slot, exc)
        raise CorpError("every Ray worker died; see the Ray logs")

    def _drop(self, slot: int, exc) -> None:
        """An actor Ray could not keep (restarts spent, or no room on the nodes left): out of the pool."""
        if slot in self.alive:
            self.alive.remove(slot)
        try:
            self.ray.kill(self.actors[slot], no_restart=True)
        except Exception:
            pass
        if not self.alive:
            raise CorpError(f"every Ray worker died; the last: {actor_cause(exc)}") from None

    def _shards(self, ctx, specialists, split, examples) -> tuple[list[list], bool]:
        """Specialists in calls: the factored groups of the local executor, or one at a time."""
        specialists = list(specialists)
        group = self._get(self.actors[self.alive[0]].factored_group.remote(split, examples)) if specialists else None
        if not group:
            return [[s] for s in specialists], False
        base = [s for s in specialists if s[0] is None]
        rest = [s for s in specialists if s[0] is not None]
        shards = [[s] for s in base] + [rest[i : i + group] for i in range(0, len(rest), group)]
        return shards, True

    def map(self, ctx, specialists: Sequence[tuple[int | None, float | None]], split: str) -> Iterator[dict]:
        ray = self.ray
        examples = ray.put(list(ctx.splits[split]))
        queue, factored = self._shards(ctx, specialists, split, examples)
        running: dict = {}  # ObjectRef -> (actor slot, shard)
        try:
            while queue or running:
                busy = {slot for slot, _ in running.values()}
                for slot in self.alive:
                    if slot not in busy and queue:
                        shard = queue.pop(0)
                        call = self.actors[slot].score.remote(shard, split, examples, self.moves_ref(), factored)
                        running[call] = (slot, shard)
                        self._sent[slot] = time.monotonic()
                ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
                if not ready:
                    self._check_head()
                    queue[:0] = self._stranded(running)
                    continue
                for ref in ready:
                    slot, shard = running.pop(ref)
                    try:
                        pid, rows = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:  # restarts or retries spent: the others take it
                        self._drop(slot, exc)
                        self.retried += 1
                        queue.insert(0, shard)
                        continue
                    if self.last_pid.get(slot, pid) != pid:  # Ray restarted this actor and retried the shard
                        self.replaced += 1
                        self.retried += 1
                    self.last_pid[slot] = pid
                    yield from rows
        finally:
            for ref in running:  # interrupted: drop what is in flight (the rows are not written)
                try:
                    ray.cancel(ref)
                except Exception:
                    pass

    def _stranded(self, running: dict) -> list[list]:
        """Shards on actors Ray cannot place again: their node is gone and the nodes left hold fewer
        actors than the pool has (Ray would keep them RESTARTING, waiting for resources, forever).
        Actors RESTARTING for STRANDED_S beyond that capacity leave the pool; the others take their shards."""
        now = time.monotonic()
        if not running or now - min(self._sent.get(slot, now) for slot, _ in running.values()) < STRANDED_S:
            return []  # nothing has been in flight long enough to ask the GCS about
        found = _bounded(lambda: {s: _actor_state(self.ray, self.actors[s]) for s, _ in running.values()})
        total = _bounded(self.ray.cluster_resources)  # alive nodes only
        if found is None or total is None:  # the GCS is slow or gone: the head check decides
            return []
        for slot, state in found.items():
            if state == "RESTARTING":
                self._restarting.setdefault(slot, now)
            else:
                self._restarting.pop(slot, None)
        capacity = min(int(total.get(k, 0.0) / v + 1e-9) for k, v in self.bundle.items() if v)
        excess = len(self.alive) - max(capacity, 1)
        stranded = []
        for ref, (slot, shard) in sorted(running.items(), key=lambda kv: self._restarting.get(kv[1][0], now)):
            since = self._restarting.get(slot)
            if excess <= 0 or since is None or now - since < STRANDED_S:
                continue
            running.pop(ref)
            self.alive.remove(slot)
            try:
                self.ray.kill(self.actors[slot], no_restart=True)
            except Exception:
                pass
            self.retried += 1
            excess -= 1
            stranded.append(shard)
        return stranded

    def close(self) -> None:
        self.watch.stop()
        lost = self.watch.lost
        if not lost:
            try:  # each actor closes its backend first (a failed close is as good as done); one that does not
                # answer in time is killed as it is
                refs = [a.close.remote() for a in self.actors]
                self.ray.wait(refs, num_returns=len(refs), timeout=60)
            except Exception:
                pass
            for a in self.actors:
                try:
                    self.ray.kill(a)
                except Exception:
                    pass
            if self.pg is not None:
                try:
                    self.ray.util.remove_placement_group(self.pg)
                except Exception:
                    pass
        self.actors, self.alive = [], []
        if self.started_ray:
            stop_ray(self.ray)
            self.started_ray = False


def _replace(cfg, changes: dict):
    import dataclasses

    return dataclasses.replace(cfg, **changes) if changes else cfg


def _bounded(fn, timeout_s: float = 2.0):
    """fn() in a daemon thread, or None when it has not answered in `timeout_s`: a GCS call blocks
    for as long as Ray retries when the head is gone, and the driver must stay free to say so."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0] if out else None


def _actor_info(ray, actor) -> dict:
    """An actor's entry in the GCS (State: ALIVE, RESTARTING, DEAD, ...; NumRestarts), without the dashboard."""
    try:
        info = ray._private.state.actors(actor._actor_id.hex())
    except Exception:
        return {}
    return info if isinstance(info, dict) else {}


def _actor_state(ray, actor) -> str | None:
    return _actor_info(ray, actor).get("State")


def _gcs_address(ray) -> str | None:
    node = getattr(ray._private.worker, "_global_node", None)
    return getattr(node, "gcs_address", None)


def actor_resources(cfg, workers: int, address: str | None, cluster_gpus: float = 0.0) -> tuple[int, dict[str, float]]:
    """(torch threads per actor, what each actor asks Ray for). CPUs: `--threads`, else on a local Ray
    the machine's cores shared out, else 1 (threads = CPUs reserved). GPUs: 1 per hf actor on
    CUDA; `--tensor-parallel-size` per vLLM engine on CUDA, or on `auto` when the cluster has GPUs.
    The GPU resource's name is `CORP_RAY_GPU_RESOURCE` (default GPU; tests stand a custom one in)."""
    threads = cfg.threads or (1 if address else max(1, (os.cpu_count() or 1) // workers))
    bundle: dict[str, float] = {"CPU": float(threads)}
    gpu_name = os.environ.get(GPU_RESOURCE_ENV, "GPU")
    backend = resolve_backend_name_safe(cfg.backend, resolve_backend_name)
    device = str(cfg.device)
    if backend == "vllm" and (device.startswith("cuda") or (device != "cpu" and cluster_gpus > 0)):
        bundle[gpu_name] = float(getattr(cfg, "tensor_parallel_size", 1) or 1)
    elif backend == "hf" and device.startswith("cuda"):
        bundle[gpu_name] = 1.0
    return threads, bundle


def actor_cause(exc: BaseException) -> str:
    """The line that says why an actor died: corp's own one-line error raised in the actor (Ray puts
    it at the end of the creation task's traceback), else the exception's last line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in reversed(lines):
        for prefix in ("corp.errors.CorpError: ", "corp.CorpError: ", "CorpError: "):
            if ln.startswith(prefix):
                return ln[len(prefix) :]
    return lines[-1] if lines else type(exc).__name__


def resolve_backend_name_safe(name: str, resolve) -> str:
    try:
        return resolve(name)
    except CorpError:
        return name


def host_spec(cfg) -> dict:
    """How the Ray driver loads corp's host copy of the weights (HostCopy): the run's model, dtype,
    parameter filter and noise scheme, on the run's device."""
    return {
        "model": cfg.model,
        "device": cfg.device,
        "dtype": cfg.dtype,
        "batch_size": cfg.batch_size,
        "param_filter": ParamFilter(getattr(cfg, "include", ".*"), getattr(cfg, "exclude", "")),
        "scheme": run_scheme(cfg),
    }


def get_executor(ctx):
    """The run's executor (created once per run context); installs the Ray backend proxy on the driver."""
    ex = ctx.executor
    if ex is not None:
        return ex
    cfg = ctx.cfg
    kind = getattr(cfg, "executor", "local") or "local"
    if kind == "local":
        ex = LocalExecutor()
    elif kind == "ray":
        ex = RayExecutor(cfg, getattr(cfg, "workers", 2), getattr(cfg, "ray_address", None))
        if not ctx.has_backend():
            ctx.set_backend(RemoteBackend(ex, ex.info, host_spec(cfg)))
    else:
        raise CorpError(f"unknown --executor '{kind}'; choose one of {', '.join(EXECUTORS)}")
    ctx.executor = ex
    return ex
