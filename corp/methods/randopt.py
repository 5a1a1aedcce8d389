"""RandOpt: random Gaussian perturbations, keep the top-K, ensemble by majority vote.

Paper: Gan & Isola, "Neural Thickets" (arXiv 2603.12228).

Where we depart from the paper / its public code, and why:
- Noise is drawn independently per tensor, keyed by (seed, tensor name); the public code reuses one
  seed for every tensor, giving all same-shaped tensors identical noise.
- Weights are restored by copying a pristine base, never by subtracting in bf16 (which drifts).
- Defaults are CPU-sized (N = 32, support 64 examples) instead of N = 5000 and 200 examples; the
  paper's scale is a matter of flags (`--population 5000 --n-support 200`).
- Top-K voting drops empty answers and breaks ties toward the higher-ranked specialist, as the
  paper describes; specialists tied on support reward are ranked by their position in the
  population (seed order), which is deterministic.
"""

from __future__ import annotations

from corp.config import RandOptConfig
from corp.errors import CorpError
from corp.evaluate.population import (
    population_line,
    population_summary,
    randopt_results,
    sigma_edge_flags,
    test_passes,
)
from corp.evaluate.scorer import ensure_population
from corp.grids import edge_lines
from corp.method import POPULATION, SMALL, BenchAdapter, Method, ints, opt
from corp.runtime.context import RunContext, run_evals
from corp.runtime.ledger import Passes, say_passes, seconds_per_example
from corp.runtime.loop import Outputs, drive
from corp.runtime.runs import ReportRow, format_rows

NAME = "randopt"  # the command and the report's method


def comparisons_vs_base(results: list[ReportRow]) -> list[tuple[str, str]]:
    return [(r.method, "base") for r in results if r.method != "base"]


def format_table(
    results: list[ReportRow], selection_flops: float | None = None, comparisons: list[dict] = (), measure="accuracy"
) -> str:
    return format_rows(results, comparisons, selection_flops, measure)


def run_randopt(cfg: RandOptConfig, backend=None) -> dict:
    return drive(cfg, NAME, backend, lambda ctx: _randopt(cfg, ctx), host_copy=None)  # it only scores


def _randopt(cfg: RandOptConfig, ctx: RunContext) -> Outputs:
    k = max(cfg.top_k)
    ranked = ensure_population(ctx, keep=k, need=lambda rows: range(min(k, len(rows))))  # racing: the top K in full
    if max(cfg.top_k) > len(ranked):
        raise CorpError(f"--top-k {max(cfg.top_k)} is larger than the population ({len(ranked)} specialists)")
    evals = run_evals(ctx)
    passes = test_passes(ctx, ranked, cfg.top_k, evals)  # the test rows' time, said before they start (issue 56)
    say_passes(
        NAME,
        [Passes("test rows", passes, passes * len(ctx.splits["test"]))],
        seconds_per_example(ranked),
        "at the population's rate",
    )
    results, _ = randopt_results(ctx, ranked, cfg.top_k, evals)
    fields = {"population": population_summary(ctx, ranked), "edge_flags": sigma_edge_flags(ctx, ranked)}

    def table(report: dict) -> str:
        flops = report["population"]["selection_ledger"]["flops"]
        lines = [format_table(results, flops, report["comparisons"], ctx.measure), population_line(ctx)]
        return "\n".join(x for x in [*lines, *edge_lines(report["edge_flags"])] if x)

    return Outputs(results, comparisons_vs_base(results), ctx.example_ids("test"), fields, table=table)


METHOD = Method(
    NAME,
    RandOptConfig,
    run_randopt,
    "RandOpt: score N perturbed specialists, report base, top-1 and top-K vote on the test split.",
    smoke={**SMALL, "population": 3, "sigmas": "0.05", "top_k": "1,2"},
    bench=BenchAdapter(
        POPULATION,
        r"randopt-top1|randopt-vote@\d+",
        flops=("population.selection_ledger.flops",),
        equal_data=True,
        unit="population",
        clip=("top_k",),
        row_names=lambda o: (
            ["randopt-top1"] + [f"randopt-vote@{k}" for k in ints(opt(o, RandOptConfig, "top_k")) if k != 1]
        ),
        touched=lambda o, seed, units: int(o.get("n_support") or 0),  # every specialist scored on the whole support
        regime={"units": 50},  # issue 39: at least 50 specialists at the top budget
    ),
)
