"""`RunContext`: a run's resolved config, task, splits, run directory, reward and (built on first
use) backend, with what every evaluation key of the run shares (`eval_context`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corp.algorithms.perturb import SCHEME_VERSION, ParamFilter
from corp.config import RunConfig
from corp.evaluate.rewards import reward_identity
from corp.evaluate.tasks import Example, Task
from corp.runtime.backends import Backend, make_backend
from corp.runtime.backends.base import check_fits
from corp.runtime.context.meta import run_scheme
from corp.runtime.ledger import Ledger
from corp.runtime.runs import RunLock, append_jsonl


@dataclass
class RunContext:
    """Everything a command needs: resolved config, task, splits, backend, reward, run directory.

    The backend is built on first use from the config unless one is given (`set_backend`);
    `release_backend` drops it (e.g. to free memory). `executor` is where population scoring runs
    (corp.runtime.executors.get_executor sets it). `close()` closes a backend it built and releases
    the run-directory lock.
    """

    cfg: RunConfig
    method: str
    task: Task
    splits: dict[str, list[Example]]
    run_dir: Path | None
    reward_fn: Callable | None
    _backend: Backend | None = None
    _weights_hash: str | None = None
    executor: object | None = None
    created: bool = False  # this invocation created run_dir (a failure that computed nothing removes it)
    lock: RunLock | None = None
    definition: dict | None = None  # what defines the population rows written here (population_definition)
    population_source: dict | None = None  # where the population came from and which rows were taken (for the report)
    live: object | None = None  # corp.tracking.LiveLog under --report-to (open_run sets it)
    built_backend: bool = False  # the backend was built here, from the config (close() closes it)
    prompts_checked: bool = False  # every prompt of the splits was found to fit the backend's context

    def log_row(self, path: str | Path, row: dict) -> None:
        """Append a metrics row (metrics.jsonl, rounds.jsonl) and hand it to `--report-to` live."""
        append_jsonl(path, row)
        if self.live is not None:
            self.live.log(path, row)

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            pf = ParamFilter(getattr(self.cfg, "include", ".*"), getattr(self.cfg, "exclude", ""))
            self._backend = make_backend(
                self.cfg.backend,
                self.cfg.model,
                self.cfg.device,
                self.cfg.dtype,
                self.cfg.batch_size,
                pf,
                self.noise_scheme,
                engine_options(self.cfg),
            )
            self.built_backend = True
        if not self.prompts_checked:
            self.prompts_checked = True
            check_prompts_fit(self._backend, self.splits, self.max_new_tokens)
        return self._backend

    @property
    def noise_scheme(self) -> str:
        """The run's noise scheme (`--noise`; full-rank when the config has none)."""
        return run_scheme(self.cfg)

    def has_backend(self) -> bool:
        return self._backend is not None

    def set_backend(self, backend: Backend) -> None:
        """Use this backend (a ready one, or a proxy such as the Ray executor's) from now on; it is
        its giver's to close (the Ray executor's proxy: `close`, with the executor)."""
        self._backend, self.built_backend = backend, False

    def release_backend(self) -> None:
        """Drop the backend (the next use builds a new one)."""
        self._backend = None

    @property
    def max_new_tokens(self) -> int:
        return self.cfg.max_new_tokens or self.task.max_new_tokens

    @property
    def measure(self) -> str:
        """What the report's rows are measured by: "accuracy", or "reward" where the task has no gold
        answers (a reward-only dataset), on which every accuracy would read 0."""
        return "accuracy" if self.task.graded() else "reward"

    @property
    def model_id(self) -> str:
        return self.backend.model_id or self.cfg.model  # None: an in-memory model, named by --model

    @property
    def weights_hash(self) -> str:
        if self._weights_hash is None:
            self._weights_hash = self.backend.weights_hash
        return self._weights_hash

    def example_ids(self, split: str) -> list[str]:
        return [e.id for e in self.splits[split]]

    def ledger(self) -> Ledger:
        return Ledger(self.backend.n_params)

    def eval_context(self) -> dict:
        """The parts of an evaluation's identity that are the same for every row of this run."""
        return {
            "model": self.model_id,
            "weights_hash": self.weights_hash,
            "backend": self.backend.name,
            "task": self.task.signature(),
            "reward": reward_identity(self.cfg.reward),
            "max_new_tokens": self.max_new_tokens,
            # another scheme's seeds are other weights; the full-rank default stays out of the key so
            # that rows cached before schemes were selectable keep their keys
            **({"noise_scheme": self.noise_scheme} if self.noise_scheme != SCHEME_VERSION else {}),
        }

    def close_built_backend(self) -> None:
        """Close the backend if this context built it (an injected one is its giver's to close)."""
        if self.built_backend and self._backend is not None:
            # a process that runs one method after another (corp bench, the Python API) kept every
            # run's vLLM engine otherwise: the frames that built it outlive the call
            # (corp.runtime.backends.vllm.from_model_name), so collection never came
            self._backend.close()
            self._backend, self.built_backend = None, False

    def close(self) -> None:
        self.close_built_backend()
        ex, self.executor = self.executor, None
        if ex is not None:  # a Ray executor stops the actors and the local Ray it started
            if getattr(self._backend, "executor", None) is ex:
                self._backend.close()  # the driver's proxy to those actors (and its host copy)
                self._backend = None
            ex.close()
        if self.lock is not None:
            self.lock.release()


def check_prompts_fit(backend: Backend, splits: dict[str, list[Example]], max_new_tokens: int) -> None:
    """Every prompt of the run's splits, with max_new_tokens, fits the model's context: checked once,
    when the run first reaches its backend (before any generation), so a prompt too long is one line
    naming its example and split, not a 1 TB allocation or hours of generation on a later split."""
    if backend.context_length is None:
        return
    seen: set[str] = set()
    for split, examples in splits.items():
        todo = [e for e in examples if e.id not in seen]  # report-on validation: test is validation again
        seen.update(e.id for e in todo)
        lengths = backend.prompt_lengths([e.prompt for e in todo]) if todo else []
        if lengths is None:
            return  # a backend that cannot count without its engine: each `generate` call checks its own
        names = [f"example '{e.id}' ({split} split)" for e in todo]
        check_fits(lengths, max_new_tokens, backend.context_length, backend.context_source, names)


def engine_options(cfg) -> dict:
    """The vLLM engine's options from a run's config (the hf backend takes none)."""
    return {
        "tensor_parallel_size": getattr(cfg, "tensor_parallel_size", 1),
        "gpu_memory_utilization": getattr(cfg, "gpu_memory_utilization", None),
        "enforce_eager": getattr(cfg, "enforce_eager", False) or None,
        "max_model_len": getattr(cfg, "max_model_len", None),
    }
