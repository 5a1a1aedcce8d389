"""`--report-to tensorboard|wandb|none` (TRL's option name): a run's per-step metrics where people read them.

Methods log per-step or per-round metrics to JSON Lines in their run directory (`metrics.jsonl`:
es, grpo, ftis; `rounds.jsonl`: fgrpo, fera; `population.jsonl`: one row per scored specialist,
score, randopt, consolidate, analyze-rank), one row per step, flushed as they go. Live, as TRL:
each row the run writes (`RunContext.log_row`, the population scorer) goes to the chosen backends
as it is written, and the writers are flushed, so the events are there while the run goes on
(`LiveLog`). Every numeric field becomes a scalar at the row's step (`step`, `iteration` or
`round`), under a prefix naming the row's arm, node or client when it has one; a specialist's
reward, sigma, tokens and seconds are `population/...` at its index in population order. The
JSONL files stay the record: the first live row starts the backends from the whole record (a
resumed run's curves are complete, and steps a method redid after its last checkpoint are not
doubled), and a run that wrote no new row (a finished run reopened) exports the record when it
ends (complete, failed or interrupted).

- `tensorboard`: event files in `RUN_DIR/tensorboard/` (torch's SummaryWriter; needs the
  `tensorboard` extra). `tensorboard --logdir runs/` shows every run.
- `wandb`: one Weights & Biases run per corp run (project `corp`, the run directory's name, the
  resolved config), offline unless `WANDB_MODE` says otherwise; needs `wandb` installed.
- `none` (the default): nothing beyond the JSONL files.

`corp bench --report-to` logs every finished cell's test accuracy at its FLOP budget.
A backend that is not installed is one line, before anything runs (`check_report_to`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path

from corp.errors import CorpError
from corp.extras import require
from corp.runtime.runs import naming, read_jsonl

BACKENDS = ("none", "tensorboard", "wandb")
POPULATION_FILE = "population.jsonl"
METRIC_FILES = ("metrics.jsonl", "rounds.jsonl", POPULATION_FILE)
SPECIALIST_FIELDS = ("reward", "sigma", "generated_tokens", "seconds")
STEP_KEYS = ("step", "iteration", "round")
GROUP_KEYS = ("arm", "node", "client")
TB_DIR = "tensorboard"


def parse_report_to(value: str | None) -> list[str]:
    """'tensorboard', 'wandb', 'tensorboard,wandb', 'none' or None -> the backends to use."""
    names = [v.strip() for v in (value or "none").split(",") if v.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad:
        raise CorpError(
            f"--report-to '{value}': unknown backend {', '.join(bad)}; "
            f"choose from {', '.join(BACKENDS)} (comma-separated)"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # two writers of one backend would write every event twice into one directory
        raise CorpError(f"--report-to '{value}' names {', '.join(twice)} twice; name each backend once")
    return [n for n in names if n != "none"]


def check_report_to(value: str | None) -> list[str]:
    """The backends, each checked to be installed (one line naming what to install otherwise)."""
    names = parse_report_to(value)
    for n in names:
        if n == "tensorboard":
            require("tensorboard", "--report-to tensorboard")
        else:
            require("wandb", "--report-to wandb")
    return names


def _rows(path: Path) -> list[dict]:

    return [r for r in read_jsonl(path) if isinstance(r, dict)] if path.is_file() else []


def scalars(row: dict) -> tuple[int | None, dict[str, float]]:
    """(step, {tag: value}) of one logged row: its numeric fields, prefixed by arm/node/client."""
    step = next((row[k] for k in STEP_KEYS if isinstance(row.get(k), int) and not isinstance(row.get(k), bool)), None)
    prefix = "/".join(
        f"{k}{row[k]}" if k != "arm" else str(row[k]) for k in GROUP_KEYS if k in row and row[k] is not None
    )
    out = {}
    for k, v in row.items():
        if k in STEP_KEYS or k in GROUP_KEYS or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[f"{prefix}/{k}" if prefix else k] = float(v)
    return step, out


def specialist_scalars(row: dict) -> tuple[int | None, dict[str, float]]:
    """(index, {population/field: value}) of one population row; a raced row (scored on part of the
    support split) or one without its population index gives nothing."""
    if not isinstance(row.get("index"), int) or row.get("kind") == "raced":
        return None, {}
    out = {}
    for k in SPECIALIST_FIELDS:
        v = row.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[f"population/{k}"] = float(v)
    return row["index"], out


def row_scalars(file_name: str, row: dict) -> tuple[int | None, dict[str, float]]:
    """(step, {tag: value}) of a row of one of METRIC_FILES."""
    return specialist_scalars(row) if file_name == POPULATION_FILE else scalars(row)


class Trackers:
    """The chosen backends for one run directory: `log(step, {tag: value})`, then `close()`."""

    def __init__(self, backends: Iterable[str], run_dir: Path, name: str, config: dict | None = None):
        self.writers: list = []
        self.run = None
        for b in backends:
            if b == "tensorboard":
                require("tensorboard", "--report-to tensorboard")
                from torch.utils.tensorboard import SummaryWriter

                logdir = run_dir / TB_DIR
                shutil.rmtree(logdir, ignore_errors=True)  # corp's own directory, rebuilt whole from the JSONL record
                self.writers.append(SummaryWriter(log_dir=str(logdir)))
            elif b == "wandb":
                wandb = require("wandb", "--report-to wandb")
                os.environ.setdefault("WANDB_MODE", "offline")  # no network unless the user asks for it
                self.run = wandb.init(
                    project=os.environ.get("WANDB_PROJECT", "corp"),
                    name=name,
                    dir=str(run_dir),
                    config=json.loads(json.dumps(config or {}, default=str)),
                    reinit=True,
                )

    def log(self, step: int | None, values: dict[str, float]) -> None:
        for w in self.writers:
            for tag, v in values.items():
                w.add_scalar(tag, v, global_step=step)
        if self.run is not None and values:
            self.run.log(values, step=step)

    def flush(self) -> None:
        for w in self.writers:
            w.flush()

    def close(self) -> None:
        for w in self.writers:
            w.flush()
            w.close()
        if self.run is not None:
            self.run.finish()


class LiveLog:
    """`--report-to` while the run goes on (module docstring): `log(path, row)` after each row is
    appended to `path` (one of METRIC_FILES in the run directory). The first row starts the backends
    and logs the whole record, that row included; later rows are logged as they come. A backend
    that fails is said once and dropped (the JSONL record is written either way); the run layer
    then exports the record when the run ends."""

    def __init__(self, run_dir: Path, report_to: str | None, config: dict | None = None):
        self.run_dir, self.report_to, self.config = Path(run_dir), report_to, config
        self.backends = parse_report_to(report_to)
        self.trackers: Trackers | None = None
        self.failed = False
        self.live = False  # a row went to the backends live

    @property
    def started(self) -> bool:
        """Whether rows went to the backends live (else the run layer exports the record at the end)."""
        return self.live and not self.failed

    def log(self, path: str | Path, row: dict) -> None:
        path = Path(path)
        if not self.backends or self.failed or path.parent != self.run_dir or path.name not in METRIC_FILES:
            return
        try:
            with naming(_written(self.run_dir, self.backends)):
                if self.trackers is None:
                    self.trackers = Trackers(self.backends, self.run_dir, self.run_dir.name, self.config)
                    self.live = True
                    for name in METRIC_FILES:  # the whole record, this row included (it is appended)
                        for r in _rows(self.run_dir / name):
                            self.trackers.log(*row_scalars(name, r))
                else:
                    self.trackers.log(*row_scalars(path.name, row))
                self.trackers.flush()
        except Exception as exc:  # noqa: BLE001 -- the row is in the JSONL record; the run goes on
            self.failed = True
            warnings.warn(
                f"--report-to {self.report_to}: live logging stopped ({type(exc).__name__}: {exc}); "
                "the record is exported when the run ends"
            )

    def close(self) -> None:
        if self.trackers is not None:
            trackers, self.trackers = self.trackers, None
            try:
                trackers.close()
            except Exception:  # noqa: BLE001 -- a writer that failed live has said so already
                if not self.failed:
                    raise


def export_run_metrics(run_dir: Path, report_to: str | None, config: dict | None = None) -> list[str]:
    """Hand a run's logged rows to the backends `report_to` names; returns the files it read."""
    backends = parse_report_to(report_to)
    files = [run_dir / f for f in METRIC_FILES if (run_dir / f).is_file()]
    if not backends or not files:
        return []
    with naming(_written(run_dir, backends)):  # a full disk names where the events go
        trackers = Trackers(backends, run_dir, run_dir.name, config)
        try:
            for path in files:
                for row in _rows(path):
                    trackers.log(*row_scalars(path.name, row))
        finally:
            trackers.close()
    return [str(f) for f in files]


def _written(where: Path, backends: list[str]) -> Path:
    """Where the backends write (the TensorBoard directory, else W&B's files in `where`)."""
    return where / TB_DIR if "tensorboard" in backends else where


def export_bench_results(results_dir: Path, report_to: str | None) -> int:
    """`corp bench --report-to`: each finished cell's test accuracy (and the FLOPs it used) at its budget.

    Tag `TASK/SETTING/METHOD/seedS/accuracy`, step = the FLOP budget (0 for budget-free rows such as
    the base); rebuilt from results.csv at every bench run. Returns the number of cells logged."""
    import csv

    backends = parse_report_to(report_to)
    path = results_dir / "results.csv"
    if not backends or not path.is_file():
        return 0
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("status") == "done" and r.get("accuracy")]
    with naming(_written(results_dir, backends)):
        trackers = Trackers(backends, results_dir, results_dir.name)
        try:
            for r in rows:
                step = int(float(r["budget"])) if r.get("budget") else 0
                tag = f"{r['task']}/{r['setting']}/{r['method']}/seed{r['seed']}"
                values = {f"{tag}/accuracy": float(r["accuracy"])}
                if r.get("flops"):
                    values[f"{tag}/flops"] = float(r["flops"])
                trackers.log(step, values)
        finally:
            trackers.close()
    return len(rows)
