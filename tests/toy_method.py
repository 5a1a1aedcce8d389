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
from corp.runtime.context import RunContext, cached_eval, run_evals
from corp.runtime.loop import Outputs, drive
from corp.runtime.runs import ReportRow

NAME = "toy"  # the command, the report's method and its row


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
    # the driver opens the run, calls _toy and writes what it returns (report.json, its table)
    return drive(cfg, NAME, backend, lambda ctx: _toy(cfg, ctx), needs=("test",), defines=None)


def _toy(cfg: ToyConfig, ctx: RunContext) -> Outputs:
    greedy = cached_eval(ctx, run_evals(ctx), "test", None)
    ids = ctx.example_ids("test")
    led = ctx.ledger().add_generation(greedy["prompt_tokens"] * cfg.passes, greedy["generated_tokens"] * cfg.passes)
    rows = [ReportRow(NAME, greedy["accuracy"], cfg.passes, led, 0, PerExample(greedy["correct"], ids))]
    return Outputs(rows, [], ids, {"passes": cfg.passes})


METHOD = Method(
    NAME,
    ToyConfig,
    run_toy,
    "A toy: the base's greedy answers as one row.",
    smoke={"n_test": 4, "max_new_tokens": 4},
    summary=lambda report: f"toy ran: {report['rows'][0]['accuracy']:.3f}",
    bench=BenchAdapter(FIXED, NAME, row_names=lambda o: [NAME], touched=lambda o, seed, units: 0),
)
