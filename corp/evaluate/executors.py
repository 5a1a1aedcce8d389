"""Executors: where population scoring runs. `local` (in this process, the default) or `ray`.

Population scoring is embarrassingly parallel over specialists. Both executors produce each row
with the same function (`corp.evaluate.context.score_one`, which calls `result_row`) and the
driver alone appends rows to `population.jsonl` with `append_jsonl`, so a Ray population is
resumable exactly like a local one and its rows are identical up to timing fields.

`ray`: one actor per worker, each holding its own backend replica built from the run's config
(`make_backend`, the same path as the local executor). `--workers W` starts a local Ray with W
CPUs; `--ray-address ADDR` joins a running cluster instead. The driver keeps one specialist in
flight per actor; when an actor dies, only its specialist in flight is lost: the actor is
replaced and that specialist is resubmitted (at most `MAX_RETRIES` times, then a one-line error).

Where this departs from the usual Ray pattern (`ray.get` over a list of remote calls) and why:
results are consumed as they complete (`ray.wait`) and written at once, so a kill of the driver
loses at most what is in flight, as with the local executor. The driver does not load a model
of its own: `ctx.backend` becomes a proxy to actor 0, which serves the few calls made outside the
population (test-split evaluations, the weights hash that keys the population's meta).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from corp import CorpError
from corp.evaluate.backends import make_backend, resolve_backend_name
from corp.evaluate.backends.host import HostCopy
from corp.evaluate.context import RunContext, engine_options, run_scheme, score_one
from corp.evaluate.rewards import resolve_reward
from corp.evaluate.tasks import get_task
from corp.perturb import ParamFilter

EXECUTORS = ("local", "ray")
MAX_RETRIES = 3


class LocalExecutor:
    name = "local"

    def map(self, ctx, specialists: Sequence[tuple[int | None, float | None]], split: str) -> Iterator[dict]:
        from corp.evaluate.batched import factored_for, score_factored

        if specialists and factored_for(ctx) is not None:  # low-rank noise on hf: one batched pass, no weights written
            yield from score_factored(ctx, specialists, split)
            return
        specialists = list(specialists)
        for i, (seed, sigma) in enumerate(specialists):
            following = specialists[i + 1] if i + 1 < len(specialists) else None
            yield score_one(ctx, seed, sigma, split, following=following)

    def close(self) -> None:
        pass


class _Worker:
    """A Ray actor's body: a backend replica and the task, scoring one specialist per call."""

    def __init__(self, cfg, threads: int | None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        task = get_task(cfg.task, cfg.data)
        pf = ParamFilter(getattr(cfg, "include", ".*"), getattr(cfg, "exclude", ""))
        backend = make_backend(
            cfg.backend, cfg.model, cfg.device, cfg.dtype, cfg.batch_size, pf, run_scheme(cfg), engine_options(cfg)
        )
        self.ctx = RunContext(cfg, "worker", task, {}, None, resolve_reward(cfg.reward), backend)

    def info(self) -> dict:
        b = self.ctx.backend
        return {
            "pid": os.getpid(),
            "model_path": str(getattr(b, "model_path", None) or "") or None,
            "model_id": self.ctx.model_id,
            "n_params": b.n_params,
            "weights_hash": self.ctx.weights_hash,
            "name": b.name,
            "capabilities": sorted(b.capabilities),
        }

    def score(self, seed, sigma, split, examples) -> dict:
        self.ctx.splits[split] = examples
        return score_one(self.ctx, seed, sigma, split)

    def set_direction(self, direction) -> None:
        self.ctx.backend.set_direction(direction)

    def move_base(self, components) -> None:
        self.ctx.backend.move_base(components)

    def generate(self, *args, **kwargs):
        return self.ctx.backend.generate(*args, **kwargs)

    def logprobs(self, *args, **kwargs):
        return self.ctx.backend.logprobs(*args, **kwargs)


class RemoteBackend(HostCopy):
    """`ctx.backend` on a Ray driver: generation goes to the executor's first live actor; direction
    algebra, the saved model and log-probabilities run on corp's host copy of the weights on the
    driver (`HostCopy`, loaded on first use: a run that only scores a population never loads it).
    It keeps the actor backend's name, model id, size and weights hash."""

    instead = "run it with --executor local"

    def __init__(self, executor: RayExecutor, info: dict, host_spec: dict):
        self.executor = executor
        self.name = info["name"]
        self.model_id = info["model_id"]
        self.n_params = info["n_params"]
        self.weights_hash = info["weights_hash"]
        self.model_path = info.get("model_path")
        self.host_spec = host_spec

    def describe(self) -> str:
        return f"the Ray driver (--executor ray: the '{self.name}' backend runs in the workers)"

    def _engine_set_direction(self, direction) -> None:
        self.executor._call_first("set_direction", direction)

    def _engine_move_base(self, components) -> None:
        self.executor.move_base(components)

    def _engine_set_base(self, state) -> None:
        raise CorpError("--executor ray scores populations; a method that trains the model runs with --executor local")

    def generate(self, *args, **kwargs):
        return self.executor._call_first("generate", *args, **kwargs)

    def close(self) -> None:
        HostCopy.close(self)


class RayExecutor:
    name = "ray"

    def __init__(self, cfg, workers: int, address: str | None = None):
        from corp.extras import require

        ray = require("ray", "--executor ray")
        self.ray, self.cfg, self.workers, self.address = ray, cfg, workers, address
        self.started_ray = init_ray(ray, address, workers)
        gpus = (
            1
            if resolve_backend_name_safe(cfg.backend, resolve_backend_name) == "vllm"
            and ray.cluster_resources().get("GPU", 0) > 0
            else 0
        )
        threads = cfg.threads or (None if address else max(1, (os.cpu_count() or 1) // workers))
        self._actor_cls = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(_Worker)
        self._threads = threads
        self.moved: list[list] = []  # every move_base so far, replayed by replacement actors
        self.actors = [self._new_actor() for _ in range(workers)]
        self.retried = 0  # specialists resubmitted after their actor died
        self.replaced = 0  # actors started to replace dead ones
        try:
            info = ray.get(self.actors[0].info.remote())
        except ray.exceptions.RayActorError as exc:
            raise CorpError(f"the Ray worker could not load the backend: {actor_cause(exc)}") from None
        self.info = info

    def _new_actor(self):
        actor = self._actor_cls.remote(self.cfg, self._threads)
        for comps in self.moved:  # a replacement starts from the base: it replays every move (same bits)
            actor.move_base.remote(comps)
        return actor

    def move_base(self, components) -> None:
        """Every actor's base moves by `components` (ES's centre), as the driver's host copy does."""
        comps = list(components)
        self.moved.append(comps)
        for slot in range(len(self.actors)):
            try:
                self.ray.get(self.actors[slot].move_base.remote(comps))
            except self.ray.exceptions.RayActorError:
                self.actors[slot] = self._new_actor()  # replays this move too
                self.replaced += 1

    def pids(self) -> list[int]:
        return [self.ray.get(a.info.remote())["pid"] for a in self.actors]

    def _call_first(self, method: str, *args, **kwargs):
        ray = self.ray
        for _attempt in range(MAX_RETRIES + 1):
            actor = self.actors[0]
            try:
                return ray.get(getattr(actor, method).remote(*args, **kwargs))
            except ray.exceptions.RayActorError:
                self.actors[0] = self._new_actor()
                self.replaced += 1
        raise CorpError(f"Ray worker died {MAX_RETRIES + 1} times running {method}; see the Ray logs")

    def map(self, ctx, specialists: Sequence[tuple[int | None, float | None]], split: str) -> Iterator[dict]:
        ray = self.ray
        examples = ray.put(list(ctx.splits[split]))
        queue = list(specialists)
        tries: dict[tuple, int] = {}
        running: dict = {}  # ObjectRef -> (actor slot, specialist)
        try:
            while queue or running:
                busy = {slot for slot, _ in running.values()}
                for slot in range(len(self.actors)):
                    if slot not in busy and queue:
                        spec = queue.pop(0)
                        ref = self.actors[slot].score.remote(spec[0], spec[1], split, examples)
                        running[ref] = (slot, spec)
                ready, _ = ray.wait(list(running), num_returns=1)
                for ref in ready:
                    slot, spec = running.pop(ref)
                    try:
                        row = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        tries[spec] = tries.get(spec, 0) + 1
                        if tries[spec] > MAX_RETRIES:
                            raise CorpError(
                                f"specialist {spec[0]} (sigma {spec[1]}) was in flight on "
                                f"{tries[spec]} Ray workers that died; see the Ray logs"
                            ) from None
                        self.actors[slot] = self._new_actor()
                        self.replaced += 1
                        self.retried += 1
                        queue.insert(0, spec)
                        continue
                    yield row
        finally:
            for ref in running:  # interrupted: drop what is in flight (the rows are not written)
                try:
                    ray.cancel(ref)
                except Exception:
                    pass

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:
                pass
        self.actors = []
        if self.started_ray:
            self.ray.shutdown()


def init_ray(ray, address: str | None, num_cpus: int | None = None) -> bool:
    """Join the Ray at `address`, or start a local one on loopback (none running yet); True when this
    call started Ray (the caller shuts it down when done). A cluster that cannot be joined is one line."""
    if ray.is_initialized():
        return False
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # ConnectionError and friends; their text is long
            raise CorpError(f"--ray-address '{address}': cannot join the Ray cluster ({type(exc).__name__})") from None
        return True
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=200 * 1024**2,
        _node_ip_address="127.0.0.1",  # a local Ray stays on loopback
    )
    return True


def actor_cause(exc: BaseException) -> str:
    """The line that says why an actor died: corp's own one-line error raised in the actor (Ray puts
    it at the end of the creation task's traceback), else the exception's last line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in reversed(lines):
        for prefix in ("corp.CorpError: ", "CorpError: "):
            if ln.startswith(prefix):
                return ln[len(prefix) :]
    return lines[-1] if lines else type(exc).__name__


def _check_reachable(address: str) -> None:
    """A plain HOST:PORT that nothing answers on is one quick error (Ray itself retries for minutes)."""
    import socket

    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError):
        raise CorpError(
            f"--ray-address '{address}': no Ray head answers there (start one with `ray start --head`)"
        ) from None


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
