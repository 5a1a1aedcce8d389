"""A run's lifecycle: `setup_run` (resolve task, splits and reward, lock the run directory, refuse a
directory made under another definition before writing anything) and `open_run` (the same for the
length of a method's run: marked complete, failed or interrupted, the lock released either way)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from tqdm.auto import tqdm

from corp.config import RunConfig, config_to_dict
from corp.errors import CorpError
from corp.evaluate.rewards import resolve_reward
from corp.evaluate.tasks import SPLITS, SplitSizes, dev_pool, get_task, make_splits
from corp.runtime.backends import Backend, resolve_backend_name
from corp.runtime.context.finish import export_report_to, write_run_card
from corp.runtime.context.meta import META_FILE, META_FORMAT, POPULATION_FILE, compare_meta, default_definition
from corp.runtime.context.run_context import RunContext
from corp.runtime.models import check_memory, check_model_reachable, resolve_device, shown_datasets
from corp.runtime.progress import progress_disabled
from corp.runtime.runs import (
    RunLock,
    finish_run_dir,
    holds_results,
    open_run_dir,
    read_json,
    write_json,
    write_status,
    write_yaml,
)
from corp.tracking import LiveLog, parse_report_to


def setup_run(
    cfg: RunConfig,
    method: str,
    backend: Backend | None = None,
    needs: Sequence[str] = ("support", "test"),
    defines: dict | None | str | Callable = "auto",
    host_copy: str | None = "beside",
) -> RunContext:
    """Resolve task, splits, reward and run directory; lock the directory; check that a reused
    directory was made under the same definition (`defines`: what the rows written here mean, or a
    function (task, splits, max_new_tokens) -> that; "auto": a population's definition for
    population configs) BEFORE writing anything; then write
    config.yaml and splits.json. `backend` injects a ready backend (tests, reuse). `host_copy`: what
    a vLLM run of the method holds on the host beside its engine, for the memory check (HOST_COPIES)."""
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task, cfg.data)
    reward_fn = resolve_reward(cfg.reward)
    splits = _run_splits(cfg, task, method, needs)
    max_new = cfg.max_new_tokens or task.max_new_tokens
    defines = _definition(defines, cfg, task, splits, max_new)
    if backend is None:  # a model that cannot be had is its error line before any run directory is announced
        check_model_reachable(cfg.model)
        _check_memory(cfg, host_copy)
    # the run's name: a Python API dataset as `dataset-<hash>`, not the path in corp's cache it is stored at
    run_dir, created = open_run_dir(cfg.run_dir, shown_datasets(cfg.task), method, cfg.seed)
    lock = RunLock(run_dir)
    try:
        lock.acquire()
        drawn = {
            "split_seed": cfg.split_seed,
            "report_on": cfg.report_on,
            **{s: [e.id for e in splits[s]] for s in SPLITS},
        }
        _check_definition(run_dir, defines, drawn)
        if not progress_disabled():
            tqdm.write(f"run directory: {run_dir}", file=sys.stderr)
        # inside the try: a full disk here leaves no half-set-up directory this call created
        write_yaml(run_dir / "config.yaml", {"method": method, **config_to_dict(cfg)})
        write_json(run_dir / "splits.json", drawn)
        write_status(run_dir, "running", method=method)
    except BaseException as exc:
        lock.release()
        if created:
            finish_run_dir(run_dir, created, exc if isinstance(exc, OSError) else RuntimeError("refused"))
        raise
    return RunContext(
        cfg, method, task, splits, run_dir, reward_fn, backend, created=created, lock=lock, definition=defines
    )


# what a method's vLLM run holds on the host beside its engine, which the method says when it opens its
# run (`drive(..., host_copy=)`): None, it only scores (no direction is ever built on the host);
# "after", its host copy is written only after it lets its engine go (Backend.release_engine);
# "beside", a host model (and its Perturber's pristine copy) the whole run long
HOST_COPIES = (None, "after", "beside")


def _check_memory(cfg: RunConfig, host_copy: str | None) -> None:
    """A model that cannot fit this machine's memory is one line now, not an out-of-memory kill later
    (CPU runs; a GPU's memory is vLLM's own to check)."""
    if host_copy not in HOST_COPIES:
        raise ValueError(f"host_copy must be one of {HOST_COPIES}, not {host_copy!r}")
    device = resolve_device(cfg.device)
    if device != "cpu":
        return
    backend = resolve_backend_name(cfg.backend, device)
    # a federated run's clients (fedcorp, fgrpo): the driver holds one backend, and clients that hold a
    # model of their own (CLIENT_MODELS) are counted beside it; fedcorp's local clients score with the
    # driver's backend, so they add nothing
    clients, client_host = _own_client_models(cfg)
    engines = cfg.workers if cfg.executor == "ray" and not hasattr(cfg, "clients") else 1
    # Ray's engines are its actors', held until the run closes: a host copy there is written beside them
    after = host_copy == "after" and cfg.executor != "ray"
    host = None if backend != "vllm" or host_copy is None else "after" if after else "beside"
    import torch

    # CoRP's operator builds its Gram matrix on the host, on either backend; the elites are not known
    # before the population is scored, so every specialist is counted as one (stage 2: its local
    # population beside the stage-1 elites its principal directions are made of)
    gram = getattr(cfg, "gram_memory_gb", None)
    seeds = getattr(cfg, "population", 0) or 0
    if gram and cfg.rounds:
        seeds += cfg.local_population
    workers = torch.get_num_threads()  # per_tensor's workers: set from --threads before this check
    check_memory(
        cfg.model,
        backend,
        cfg.dtype,
        engines,
        host_copy=host,
        gram_memory_gb=gram,
        workers=workers,
        seeds=seeds,
        clients=clients,
        client_host_copy=client_host if backend == "vllm" else None,
        # a federated run's driver aggregates what its clients train (FGRPOServer never steps)
        driver_steps=not getattr(cfg, "client_models", ()),
        **_full_training(cfg),
    )


def _own_client_models(cfg) -> tuple[int, str | None]:
    """(how many of a federated run's clients hold a model of their own on this machine, what each holds
    beside its engine): the config's `client_models` (the executors under which its clients build their
    own, a ClassVar) and `client_host_copy`. Clients of a Ray cluster joined by --ray-address run on its
    nodes, not counted here."""
    if cfg.executor not in getattr(cfg, "client_models", ()) or getattr(cfg, "ray_address", None):
        return 0, None
    return int(cfg.clients), getattr(cfg, "client_host_copy", None)


def _full_training(cfg: RunConfig) -> dict:
    """What a run that trains every parameter holds beside its model (the GRPO family with --lora-r 0:
    gradients, AdamW's moments, a reference model under --beta, F-TIS's other nodes), for check_memory."""
    if getattr(cfg, "lora_r", None) != 0:
        return {}  # not a trainer, or LoRA: its adapters are a small share of the weights
    nodes = cfg.node_models() if hasattr(cfg, "node_models") else [cfg.model]
    lighter = (
        "--lora-r 16 trains adapters only (GRPO's LoRA)"
        if not hasattr(cfg, "node_models")
        else "smaller --nodes models (F-TIS trains every parameter of every node)"
    )
    return {"trained": nodes, "reference": getattr(cfg, "beta", 0.0) != 0.0, "lighter": lighter}


def _run_splits(cfg: RunConfig, task, method: str, needs: Sequence[str]) -> dict:
    """The run's splits, "test" being the one the report's rows are on (--report-on); one line for an
    empty split the method needs."""
    sizes = SplitSizes(cfg.n_support, cfg.n_probe, cfg.n_validation, cfg.n_test)
    # a split the method never reads is not drawn (reporting on validation reads it)
    used = (*needs, "validation") if cfg.report_on == "validation" else needs
    splits = make_splits(task, sizes, cfg.split_seed, used)
    if cfg.report_on == "validation":
        # a hyperparameter trial: every row a method reports on "test" is computed on validation
        # instead, and the test examples are not evaluated at all
        splits["test"] = list(splits["validation"])
    elif cfg.report_on == "dev":
        # a hyperparameter trial on the task's development pool (heldout=START,dev=N): disjoint from
        # every selection split and from test, whatever the split sizes
        splits["test"] = dev_pool(task, cfg.task)
    for split in needs:
        if not splits[split]:
            raise CorpError(f"the {split} split is empty but {method} needs it; set --n-{split} >= 1")
    return splits


def _definition(defines: dict | None | str | Callable, cfg: RunConfig, task, splits: dict, max_new: int):
    """`setup_run`'s `defines` ("auto", a function of the task and splits, a dict or None) as the
    definition itself."""
    if defines == "auto":
        return default_definition(cfg, task, splits, max_new)
    if callable(defines):
        return defines(task, splits, max_new)
    return defines


def _check_definition(run_dir, defines, drawn: dict) -> None:
    """Refuse a reused run directory whose population was written under another definition, or by an
    older corp, before anything is written to it (`drawn`: the splits.json this run is to write)."""
    if defines is not None and (run_dir / META_FILE).exists():
        found = read_json(run_dir / META_FILE)
        if found.get("format") != META_FORMAT:
            raise CorpError(
                f"the population in '{run_dir}' was written by an older corp "
                "(rows not keyed by their examples); use another --output-dir"
            )
        compare_meta(found, defines, run_dir, POPULATION_FILE, drawn=drawn)


@contextmanager
def open_run(
    cfg: RunConfig,
    method: str,
    backend: Backend | None = None,
    needs: Sequence[str] = ("support", "test"),
    defines: dict | None | str | Callable = "auto",
    host_copy: str | None = "beside",
) -> Iterator[RunContext]:
    """`setup_run` for the length of a method's run: on success the run is marked complete; on an
    error a directory this call created that holds nothing computed is removed, any other is marked
    FAILED (or interrupted); the lock is released either way. A SIGTERM (a job scheduler, `timeout`)
    is turned into an interrupt while the run is open, so it is recorded like Ctrl-C (SIGKILL cannot be)."""
    ctx = setup_run(cfg, method, backend, needs, defines, host_copy)
    if parse_report_to(getattr(cfg, "report_to", "none")):
        ctx.live = LiveLog(ctx.run_dir, cfg.report_to, {"method": method, **config_to_dict(cfg)})
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    exported = False
    try:
        yield ctx
        # a full disk while writing the card or the event files fails the run like any other write
        # (what was computed stays; a rerun with --output-dir writes them without recomputing)
        write_run_card(ctx)
        exported = True
        export_report_to(ctx, fail_on_write=True)
    except BaseException as exc:
        finish_run_dir(ctx.run_dir, ctx.created, exc)
        _note_run(exc, ctx.run_dir)
        if not exported:
            export_report_to(ctx)  # a failed run's logged steps too; the run's own error is the one reported
        raise
    else:
        finish_run_dir(ctx.run_dir, ctx.created, None)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        ctx.close()


def _note_run(exc: BaseException, run_dir) -> None:
    """Record on the error that ends a run where it ran and whether anything it did is kept there
    (`corp_run_dir`, `corp_saved`): the CLI's Ctrl-C and full-disk lines name the directory to resume
    with, and never say work was saved when none was (a run in runs/NAME without --output-dir too)."""
    try:
        exc.corp_run_dir, exc.corp_saved = run_dir, holds_results(run_dir)
    except (AttributeError, TypeError, OSError):  # an exception type without attributes; an unreadable directory
        pass


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt("terminated (SIGTERM)")
