"""`--report-to tensorboard|wandb|none` (TRL's option name): a run's per-step metrics where people read them.

Methods log per-step or per-round metrics to JSON Lines in their run directory (`metrics.jsonl`:
es, grpo, ftis; `rounds.jsonl`: fgrpo, fera), one row per step, flushed as they go. When the run
ends (complete, failed or interrupted), the run layer (`open_run`) hands those rows to the chosen
backends: every numeric field becomes a scalar at the row's step (`step`, `iteration` or `round`),
under a prefix naming the row's arm, node or client when it has one. The JSONL files stay the
record; the event files are rebuilt from them at every end, so a resumed run's events are whole
and never doubled. Departure from TRL, which logs live: here the events appear when the run ends.

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
from collections.abc import Iterable
from pathlib import Path

from corp import CorpError
from corp.extras import require
from corp.runs import naming

BACKENDS = ("none", "tensorboard", "wandb")
METRIC_FILES = ("metrics.jsonl", "rounds.jsonl")
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
    from corp.runs import read_jsonl

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

    def close(self) -> None:
        for w in self.writers:
            w.flush()
            w.close()
        if self.run is not None:
            self.run.finish()


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
                    step, values = scalars(row)
                    trackers.log(step, values)
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
