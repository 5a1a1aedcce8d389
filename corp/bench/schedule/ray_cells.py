"""`corp bench --executor ray`: the bench's cells as Ray tasks.

Each cell is one Ray task reserving what it uses: `threads` CPUs (its torch threads are set to that
number) and, on CUDA, a GPU (as many as its vLLM tensor-parallel size). The task runs the cell exactly
as the local path does (`attempt`: the cell's claim, its run directory, its record written
atomically by `write_json`), so the cell records, and the outputs written from them, are the local
run's apart from timing fields (wall_seconds, wall_seconds_increment, population_seconds). A task
whose worker dies is rerun by Ray (`max_retries`, CELL_RETRIES); a killed cell never leaves a record,
and its rerun resumes from its run directory's cache.

The driver (this process) keeps the order the records depend on, so every cell sees what it sees in
a local run:
- a population cell waits for its predecessor (`Bench.predecessor`: its first try is sized by that
  record), and a shared population is scored here, before the cells that read it run and while no
  cell task runs (its actors need the CPUs), through corp's Ray executor (`corp score --executor
  ray`, `workers` actors);
- the cells of one training run (an iterative method's budgets, a raced population, a fixed method's
  settings that share a run directory) run one after another, in plan order;
- a final cell under `hyperparameters: search` runs once its trials have records (`Bench.resolve`).
A cell another process holds (its claim, or a run directory it needs) comes back as None and is
submitted again CORP_BENCH_WAIT seconds later.
"""

from __future__ import annotations

import dataclasses
import os
import time

from tqdm.auto import tqdm

from corp.bench.schedule.claims import attempt
from corp.errors import CorpError, RunBusy
from corp.extras import require
from corp.method import POPULATION
from corp.runtime.backends import resolve_backend_name
from corp.runtime.executors import actor_cause, init_ray
from corp.runtime.models import cuda_count
from corp.runtime.progress import progress_disabled
from corp.runtime.ray_cluster import stop_ray, warn_oversubscribed

CELL_RETRIES = 3  # Ray reruns a cell task whose worker process died this many times


def cell_threads(cfg) -> int:
    """Torch threads (= CPUs reserved) per cell: `threads`, else on a local Ray the cores over `workers`,
    else 1 (on a cluster, set --threads to what a cell should use)."""
    if cfg.threads:
        return int(cfg.threads)
    return 1 if cfg.ray_address else max(1, (os.cpu_count() or 1) // cfg.workers)


def cell_gpus(cell) -> int:
    """GPUs a cell reserves: one engine's (its vLLM tensor-parallel size) when it runs on CUDA, else none."""

    device = str(cell.opts.get("device") or "cpu")
    try:
        backend = resolve_backend_name(cell.opts.get("backend") or "auto")
    except CorpError:
        backend = cell.opts.get("backend")
    on_gpu = device.startswith("cuda") or (backend == "vllm" and _cuda())
    return int(cell.opts.get("tensor_parallel_size") or 1) if on_gpu else 0


def _cuda() -> bool:

    return cuda_count() > 0


def lane(cell) -> tuple | None:
    """Cells with one lane share a run directory and run in plan order (None: a population prefix cell,
    ordered by its predecessor instead). Settings share a run directory unless the method's split
    sizes differ between them (`equal_data`)."""
    if cell.adapter.kind == POPULATION and cell.opts.get("race", "off") == "off":
        return None
    setting = cell.setting if cell.adapter.equal_data or cell.setting == "tune" else "*"
    return (cell.task, setting, cell.seed, cell.label, cell.trial)


def _run_cell(bench_cls, cfg, cells, cell, threads: int, cwd: str):
    """The Ray task: run one cell as the local path does (None: another process holds it). `bench_cls`
    is the driver's (type(bench)), so the task runs the class the driver runs."""
    import ray
    import torch

    node = ray.util.get_node_ip_address()
    try:
        os.chdir(cwd)  # the bench's paths (model, work and results directories) are the driver's
    except OSError:
        raise CorpError(
            f"node {node}: the driver's working directory '{cwd}' is not there; corp bench --executor ray "
            "needs it, WORK_DIR and RESULTS_DIR on a filesystem every node sees"
        ) from None
    bench = bench_cls(cfg)
    bench.cells = cells
    if not (bench.out / "cells").is_dir():
        raise CorpError(
            f"node {node}: the bench's results directory '{bench.out}' is not there; put RESULTS_DIR and "
            "WORK_DIR on a filesystem every node sees"
        )
    torch.set_num_threads(threads)
    # threads is not part of a cell's key or record: the cell uses what Ray reserved for it
    return attempt(bench, dataclasses.replace(cell, opts={**cell.opts, "threads": threads}))


def run_cells_on_ray(bench, cells: list, mine) -> int:
    """Run every planned cell `mine` accepts that has no record, as Ray tasks; returns how many ran."""

    ray = require("ray", "corp bench --executor ray")
    cfg = bench.cfg
    threads = cell_threads(cfg)
    # a local Ray gets exactly `workers` cells' CPUs, so `workers` cells run at once
    if not (cfg.ray_address or ray.is_initialized()):
        warn_oversubscribed(cfg.workers, threads)
    started = init_ray(ray, cfg.ray_address, None if cfg.ray_address else cfg.workers * threads)
    wait = float(os.environ.get("CORP_BENCH_WAIT", "30"))
    order = {id(c): i for i, c in enumerate(cells)}
    driver = _Driver(ray, bench, cells, threads, wait, order, pending=[c for c in cells if mine(c)])
    bench.score_on = {"executor": "ray", "workers": cfg.workers, "ray_address": cfg.ray_address}
    try:
        driver.start()
        return driver.run()
    finally:
        for ref in driver.running:  # interrupted: what is in flight leaves no record (its run directory resumes)
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        if started:
            stop_ray(ray)


@dataclasses.dataclass
class _Driver:
    """The driver's loop of `run_cells_on_ray`, split by job (which cells are ready, the shared populations,
    submitting, collecting); its state is the loop's, kept between those steps."""

    ray: object
    bench: object
    cells: list
    threads: int
    wait: float
    order: dict
    pending: list
    running: dict = dataclasses.field(default_factory=dict)  # ObjectRef -> planned cell
    # planned cell -> when a deferred one may be submitted again
    not_before: dict[int, float] = dataclasses.field(default_factory=dict)
    # planned population cells whose shared population is scored as far as they need
    scored: set[int] = dataclasses.field(default_factory=set)
    task: object = None
    have: dict | None = None
    shared: object = None
    bar: object = None

    def start(self) -> None:
        """The Ray task, the cluster's resources, the plan in Ray's object store and the progress bar."""
        self.task = self.ray.remote(max_retries=CELL_RETRIES)(_run_cell)
        self.have = self.ray.cluster_resources()
        self.shared = self.ray.put(self.cells)
        self.bar = tqdm(
            total=len(self.pending),
            desc=f"bench {self.bench.cfg.name} (ray)",
            unit="cell",
            dynamic_ncols=True,
            disable=progress_disabled(),
        )

    def run(self) -> int:
        """Submit and collect until every cell ran or what is left waits on other processes."""
        ran = 0
        while self.pending or self.running:
            now = time.monotonic()
            ready = self._ready(now)
            # shared populations first, scored by the Ray executor's actors while no cell task holds the
            # CPUs they need (at the start: every population the plan can name yet; a tuned final's, once
            # its trials chose its scales, when the cells in flight are done)
            if not self.running:
                self._score_populations(now)
            ready = [(p, c) for p, c in ready if c.adapter.kind != POPULATION or id(p) in self.scored]
            for planned, cell in ready:
                self._submit(planned, cell)
            if not self.running:
                if not any(t > time.monotonic() for t in self.not_before.values()):
                    break  # what is left waits on cells this process does not run
                time.sleep(min(self.wait, 1.0))
                continue
            ran += self._collect()
        self.bar.close()
        return ran

    def _ready(self, now: float) -> list[tuple]:
        """(planned, resolved) cells that may be submitted now; those already recorded leave `pending`."""
        ready = []
        for planned in list(self.pending):
            cell = self.bench.resolve(planned, self.cells)  # None: its trials have not all run
            if cell is None or self.not_before.get(id(planned), 0.0) > now:
                continue
            if self.bench.load_record(cell) is not None:
                self.pending.remove(planned)
                self.bar.update(1)
            elif not _blocked(self.bench, planned, cell, self.pending, self.running):
                ready.append((planned, cell))
        return ready

    def _score_populations(self, now: float) -> None:
        """Score here the shared population of every pending population cell the plan can name yet."""
        for planned in self.pending:
            cell = self.bench.resolve(planned, self.cells)
            if cell is None or cell.adapter.kind != POPULATION or id(planned) in self.scored:
                continue
            try:
                self.bench.population(cell)
                self.scored.add(id(planned))
            except RunBusy:  # another process is scoring it
                self.not_before[id(planned)] = now + self.wait

    def _submit(self, planned, cell) -> None:
        """One cell as a Ray task reserving its CPUs and GPUs (refused when the cluster has too few)."""
        threads, have = self.threads, self.have
        gpus = cell_gpus(cell)
        if threads > have.get("CPU", 0) or gpus > have.get("GPU", 0):
            raise CorpError(
                f"cell {cell.record_name()} needs {threads} CPU(s) and {gpus} GPU(s); the Ray cluster has "
                f"{have.get('CPU', 0):g} and {have.get('GPU', 0):g} (lower --threads)"
            )
        ref = self.task.options(num_cpus=threads, num_gpus=gpus).remote(
            type(self.bench), self.bench.cfg, self.shared, cell, threads, os.getcwd()
        )
        self.running[ref] = planned
        self.pending.remove(planned)

    def _collect(self) -> int:
        """Wait for one task (at most `wait` seconds); returns how many cells finished. A cell another
        process holds goes back to `pending`, again later, in plan order."""
        ran = 0
        done, _ = self.ray.wait(list(self.running), num_returns=1, timeout=self.wait)
        for ref in done:
            planned = self.running.pop(ref)
            rec = _result(self.ray, ref, planned)
            if rec is None:  # another process holds it: again later, in plan order
                self.not_before[id(planned)] = time.monotonic() + self.wait
                self.pending.append(planned)
                self.pending.sort(key=lambda c: self.order[id(c)])
            else:
                ran += 1
                self.bar.update(1)
        return ran


def _result(ray, ref, planned):
    """A finished cell task's record (None: another process holds the cell); its failure as one error line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the cell itself failed (corp's own error: its line)
        raise CorpError(f"bench cell {planned.record_name()}: {actor_cause(exc)}") from None
    except ray.exceptions.RayError as exc:
        raise CorpError(
            f"bench cell {planned.record_name()}: its Ray worker died {CELL_RETRIES + 1} times "
            f"({type(exc).__name__}); see the Ray logs"
        ) from None


def _blocked(bench, planned, cell, pending: list, running: dict) -> bool:
    """Whether an earlier cell that `cell`'s record depends on is still to run (see the module docstring)."""
    unfinished = [c for c in pending if c is not planned] + list(running.values())
    key = lane(cell)
    if key is None:
        before = bench.predecessor(cell)
        return before is not None and any(c is before for c in unfinished)
    ahead = [c for c in pending[: pending.index(planned)]] + list(running.values())
    return any(lane(c) == key for c in ahead)
