"""A toy method written the way docs/development.md says a method is added: one module with its
config dataclass, its run function and its `METHOD` (here with a bench adapter). The test that uses
it (tests/test_methods.py) registers it as the registry line would, and runs it through the CLI and
`corp bench`.

"greedy-twice": the base model's greedy answers, scored once per pass, reported as one row; it spends
no training compute, so the bench runs it as a fixed method (one cell per seed serves every budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from corp.algorithms.stats import PerExample
from corp.config import RunConfig
from corp.errors import CorpError
from corp.method import FIXED, BenchAdapter, Method
from corp.runtime.context import cached_eval, open_run, run_evals
from corp.runtime.runs import ReportRow, format_rows, write_report


@dataclass
class ToyConfig(RunConfig):
    passes: int = 1
    """How many greedy passes the row is charged for (the toy's one option)."""

    def validate(self) -> ToyConfig:
        super().validate()
        if self.passes < 1:
            raise CorpError(f"--passes must be >= 1, got {self.passes}")
        return self


def run_toy(cfg: ToyConfig, backend=None) -> dict:
    with open_run(cfg, "toy", backend, needs=("test",), defines=None) as ctx:
        greedy = cached_eval(ctx, run_evals(ctx), "test", None)
        ids = ctx.example_ids("test")
        led = ctx.ledger().add_generation(greedy["prompt_tokens"] * cfg.passes, greedy["generated_tokens"] * cfg.passes)
        rows = [ReportRow("toy", greedy["accuracy"], cfg.passes, led, 0, PerExample(greedy["correct"], ids))]
        report = write_report(ctx.run_dir, "toy", cfg.model, cfg.task, rows, [], ids, passes=cfg.passes)
    report["table"] = format_rows(rows, report["comparisons"])
    return report


METHOD = Method(
    "toy",
    ToyConfig,
    run_toy,
    "A toy: the base's greedy answers as one row.",
    smoke={"n_test": 4, "max_new_tokens": 4},
    summary=lambda report: f"toy ran: {report['rows'][0]['accuracy']:.3f}",
    bench=BenchAdapter(FIXED, r"toy", row_names=lambda o: ["toy"], touched=lambda o, seed, units: 0),
)
