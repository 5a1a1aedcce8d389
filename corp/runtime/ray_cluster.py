"""The Ray cluster under `--executor ray`: starting a local one on loopback, joining one, and what
corp checks before any work (free resources, the paths each node needs, a head that stays up).

Loopback. `ray.init(_node_ip_address="127.0.0.1")` alone does not keep a local Ray on loopback in
Ray 2.60: `ray.init` turns a loopback address into the machine's routable one
(`services.resolve_ip_for_localhost`), so GCS, raylet and workers listen on every interface and the
runtime-env agent on the routable address. Ray keeps everything on 127.0.0.1 only where it treats
the machine as a single-node one (its `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` mode, read into
`ray_constants.ENABLE_RAY_CLUSTER`), so `loopback()` turns that on while Ray starts; the processes
Ray starts then inherit it. After starting, `exposed_sockets` lists every listening socket of Ray's
processes that is not on loopback, and corp refuses (one line naming the setting) if there is one.

A lost head. When the GCS goes away, Ray's driver retries for 60 s and then ends the process;
`HeadWatch` notices within a few seconds (a TCP connect to the GCS port every half second) so the
executor can stop with one line and the run is recorded as interrupted (resumable).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from corp.errors import CorpError
from corp.evaluate.tasks.base import path_and_options

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-node mode, every socket on 127.0.0.1
GPU_RESOURCE_ENV = "CORP_RAY_GPU_RESOURCE"  # the Ray resource that stands for one GPU (tests: a custom one)
FORWARDED_ENV = ("CORP_", "HF_", "TRANSFORMERS_")  # env prefixes the driver passes to its actors
HEAD_LOST_AFTER_S = 3.0  # the GCS unreachable this long: the head is lost


@contextlib.contextmanager
def loopback() -> Iterator[None]:
    """Ray nodes started inside this block (ray.init, ray.cluster_utils.Cluster) listen on 127.0.0.1 only."""
    from ray._private import ray_constants

    before_env, before = os.environ.get(LOOPBACK_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before
        if before_env is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = before_env


def ray_pids(node) -> list[int]:
    """Every process of a Ray node this driver started (GCS, raylet, agents) and their children (workers)."""
    import psutil

    pids = set()
    for infos in getattr(node, "all_processes", {}).values():
        for info in infos:
            try:
                proc = psutil.Process(info.process.pid)
                pids.add(proc.pid)
                pids.update(c.pid for c in proc.children(recursive=True))
            except psutil.Error:
                continue
    return sorted(pids)


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def exposed_sockets(pids) -> list[str]:
    """'NAME (pid P) on IP:PORT' for each listening TCP socket of `pids` not on loopback."""
    import psutil

    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN and not is_loopback(c.laddr.ip):
                out.append(f"{name} (pid {pid}) on {c.laddr.ip}:{c.laddr.port}")
    return out


def check_loopback(ray) -> None:
    """Refuse (after stopping it) a local Ray whose processes listen beyond loopback."""
    node = ray._private.worker._global_node
    try:
        exposed = exposed_sockets(ray_pids(node))
    except ImportError:  # psutil comes with ray; without it there is nothing to check with
        return
    if exposed:
        stop_ray(ray)
        raise CorpError(
            f"the local Ray listens beyond loopback ({exposed[0]}) although {LOOPBACK_ENV}=0 was set; "
            "start a cluster yourself (`ray start --head --node-ip-address 127.0.0.1`) and pass --ray-address"
        )


def init_ray(ray, address: str | None, num_cpus: int | None = None, origin: str = "--ray-address") -> bool:
    """Join the Ray at `address`, or start a local one on loopback (none running yet); True when this
    call started or joined Ray (the caller shuts it down when done). A cluster that cannot be joined
    is one line naming the cause."""
    if ray.is_initialized():
        return False
    if address:
        _check_reachable(address, origin)
        # a cluster on this machine's loopback: keep Ray from turning 127.0.0.1 into the routable address
        # (a remote one: the driver must give the cluster its routable address, so not then)
        near = loopback() if _is_loopback_address(address) else contextlib.nullcontext()
        try:
            with near:
                ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # ConnectionError, auth errors and friends; their text is long
            raise CorpError(f"{origin} '{address}': cannot join the Ray cluster ({join_cause(exc)})") from None
        return True
    temp = tempfile.mkdtemp(prefix="corp-ray-")  # corp's own: its session_* goes with it (stop_ray)
    with loopback():
        ray.init(
            address="local",  # never RAY_ADDRESS here: the caller decided (RayExecutor honours it as --ray-address)
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=200 * 1024**2,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp,
        )
    _OWN.update(temp=temp, procs=_processes(ray_pids(ray._private.worker._global_node)))
    check_loopback(ray)
    return True


# the local Ray this process started (init_ray): its temp dir and its processes, which stop_ray ends
_OWN: dict = {}


def _processes(pids) -> list:
    """psutil handles of `pids` (a handle knows its process's start time: a reused pid is not it)."""
    import psutil

    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid))
    return out


def stop_ray(ray, wait_s: float = 5.0) -> None:
    """`ray.shutdown()`, and for a Ray `init_ray` started here, every process of it still running (after
    a lost head Ray leaves its raylet, dashboard and runtime-env agents for a minute or two) and its
    temp dir (Ray leaves a session_* directory there on every run). A joined cluster is left alone."""
    own = dict(_OWN)
    _OWN.clear()
    procs = _with_children(own.get("procs", []))  # before shutdown: the workers they started since
    ray.shutdown()
    if own:
        _end(procs, wait_s)
        shutil.rmtree(own["temp"], ignore_errors=True)


def _with_children(procs: list) -> list:
    import psutil

    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            out += [proc, *proc.children(recursive=True)]
    return out


def _end(procs: list, wait_s: float) -> None:
    """SIGTERM to each process still running, SIGKILL to those still there after `wait_s`."""
    import psutil

    alive = [p for p in procs if p.is_running()]
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, left = psutil.wait_procs(alive, timeout=wait_s)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def warn_oversubscribed(workers: int, threads: int) -> None:
    """A local Ray that corp starts is given workers x threads CPUs whatever the machine has and runs
    every worker at once, so more than the machine's cores makes each slower and the run slower than
    with fewer (issue 57: 5 workers on 2 cores took 2.5x the time of --executor local, with no line).
    One line before any work, saying what Ray will do and what to pass instead."""
    cpus, need = machine_cpus(), workers * threads
    if need <= cpus:
        return
    fit = min(workers, cpus)
    warnings.warn(
        f"--executor ray: {workers} worker(s) x {threads} thread(s) = {need} CPUs, but this machine has {cpus}: "
        f"Ray runs all {workers} at once on {cpus} cores, each slower, so the run takes longer than with fewer; "
        f"pass --workers {fit} --threads {max(1, cpus // fit)} (workers x threads at most {cpus}), or --executor local",
        stacklevel=2,
    )


def _is_loopback_address(address: str) -> bool:
    host = address.split("://")[-1].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return is_loopback(host)
    except ValueError:
        return False


def join_cause(exc: BaseException) -> str:
    """Why joining failed, in one line; an auth failure names the token the driver used."""
    text = " ".join(str(exc).split())
    low = text.lower()
    if "auth" in low or "token" in low or "unauthenticated" in low:
        where = "RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else str(Path.home() / ".ray" / "auth_token")
        return (
            f"{type(exc).__name__}: the cluster refused this driver's auth token ({where}; a local Ray that "
            "corp or ray.init started writes ~/.ray/auth_token): use the token the cluster was started with "
            "(RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
        )
    last = text[-300:] if text else ""
    return f"{type(exc).__name__}: {last}" if last else type(exc).__name__


def _check_reachable(address: str, origin: str = "--ray-address") -> None:
    """A plain HOST:PORT that nothing answers on is one quick error (Ray itself retries for minutes)."""
    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError):
        raise CorpError(
            f"{origin} '{address}': no Ray head answers there (start one with `ray start --head`"
            + (", or unset RAY_ADDRESS for a local Ray)" if origin == "RAY_ADDRESS" else ")")
        ) from None


def check_free(ray, workers: int, per_actor: dict[str, float], settle_s: float = 10.0) -> None:
    """One line before any work when the cluster has not `workers` x `per_actor` free (Ray would
    start what fits and leave the rest pending forever). Where the cluster holds enough in total,
    wait up to `settle_s` for them to be free: Ray's view of free resources lags a task or actor
    that has just ended (the bench scores a population right after its cell tasks finish)."""
    deadline = time.monotonic() + settle_s
    while True:
        short = _short(ray.available_resources(), workers, per_actor)
        if short is None:
            return
        res, free = short
        total = ray.cluster_resources().get(res, 0.0)
        if total + 1e-9 < workers * per_actor[res] or time.monotonic() >= deadline:
            amount = per_actor[res]
            raise CorpError(
                f"--workers {workers} needs {workers * amount:g} {res} ({amount:g} per worker) but the Ray cluster "
                f"has {free:g} free of {total:g}; lower --workers (or --threads) or add nodes"
            )
        time.sleep(0.25)


def _short(free: dict, workers: int, per_actor: dict[str, float]) -> tuple[str, float] | None:
    """The first resource (GPUs first: the scarce ones) of which fewer than needed are free, or None."""
    for res, amount in sorted(per_actor.items(), key=lambda kv: kv[0] == "CPU"):
        if amount and free.get(res, 0.0) + 1e-9 < workers * amount:
            return res, free.get(res, 0.0)
    return None


def placement_group(ray, workers: int, bundle: dict[str, float], timeout_s: float = 60.0):
    """One bundle per engine (its CPUs and its GPUs: tensor_parallel_size of them on one node), PACKed.
    The caller has checked the resources are free; a group that is still not placed is one line."""
    from ray.util.placement_group import placement_group as make

    pg = make([dict(bundle) for _ in range(workers)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise CorpError(
            f"Ray could not place {workers} engines of {bundle} within {timeout_s:g} s "
            "(each engine's GPUs must be on one node); lower --workers or --tensor-parallel-size"
        )
    return pg


def _paths_here(paths: list[str]) -> dict:
    """On a node: which of `paths` are missing, and where this node is."""
    import ray

    return {
        "node": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "missing": [p for p in paths if not os.path.exists(p)],
    }


def check_nodes_have(ray, paths: list[str]) -> None:
    """Every alive node must see `paths` (absolute): one line naming the first node and path missing."""
    if not paths:
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check = ray.remote(num_cpus=0)(_paths_here)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(paths)
        for n in nodes
    ]
    try:
        answers = ray.get(refs, timeout=120)
    except ray.exceptions.RayError as exc:  # e.g. corp not importable there: the last line says why
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise CorpError(
            f"a Ray node could not run corp's path check ({lines[-1] if lines else type(exc).__name__}); "
            "every node needs corp and its dependencies installed, as on the driver"
        ) from None
    for found in answers:
        if found["missing"]:
            raise CorpError(
                f"Ray node {found['node']} ({found['node_id'][:8]}) has no '{found['missing'][0]}'; every node "
                "needs the model directory, task data and reward module at the same absolute path (docs/setup.md)"
            )


def node_paths(cfg) -> tuple[dict, list[str]]:
    """(config fields to replace, absolute paths every node must have): a relative `--model DIR`,
    `--task jsonl:FILE`, `--reward FILE.py:fn` and `--data DIR` made absolute on the driver (each
    names the same thing it named here, so row keys do not change: they use resolved paths)."""

    changes, paths = {}, []
    model = Path(str(cfg.model)).expanduser() if cfg.model else None
    if model is not None and model.exists():
        changes["model"] = str(model.resolve())
        paths.append(changes["model"])
    task = str(cfg.task or "")
    if task.startswith("jsonl:"):
        rest = task[len("jsonl:") :]
        path, options = path_and_options("jsonl", rest)
        absolute = str(Path(path).expanduser().resolve())
        tail = rest[len(path) :]
        if "test" in options:  # a second file (test=PATH2): absolute too
            options["test"] = str(Path(str(options["test"])).expanduser().resolve())
            paths.append(options["test"])
            tail = ":" + ",".join(f"{k}={v}" for k, v in options.items())
        changes["task"] = "jsonl:" + absolute + tail
        paths.append(absolute)
    reward = getattr(cfg, "reward", None)
    if isinstance(reward, str) and ":" in reward:
        module, _, fn = reward.rpartition(":")
        if module.endswith(".py") or "/" in module:
            absolute = str(Path(module).expanduser().resolve())
            changes["reward"] = f"{absolute}:{fn}"
            paths.append(absolute)
    data = getattr(cfg, "data", None) or os.environ.get("CORP_DATA_DIR")
    if data and Path(data).expanduser().exists():
        changes["data"] = str(Path(data).expanduser().resolve())
        paths.append(changes["data"])
    return changes, paths


def forwarded_env() -> dict[str, str]:
    """corp's and Hugging Face's settings, for actors on nodes that did not inherit this environment."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}


class HeadWatch:
    """A thread that connects to the GCS port every half second; `lost` once it has not answered
    for HEAD_LOST_AFTER_S (Ray's own driver would retry for a minute and then end the process)."""

    def __init__(self, gcs_address: str | None, period_s: float = 0.5):
        self.lost = False
        self._stop = threading.Event()
        self._thread = None
        if not gcs_address or ":" not in gcs_address:
            return
        host, _, port = gcs_address.rpartition(":")
        self.host, self.port, self.period_s = host.strip("[]"), int(port), period_s
        self.gcs_address = gcs_address
        self._thread = threading.Thread(target=self._run, name="corp-ray-head-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import time

        down_since = None
        while not self._stop.wait(self.period_s):
            try:
                socket.create_connection((self.host, self.port), timeout=self.period_s).close()
                down_since = None
            except OSError:
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since >= HEAD_LOST_AFTER_S:
                    self.lost = True
                    return

    def stop(self) -> None:
        self._stop.set()
