"""Self-consistency@K: the base model sampled K times per question, majority vote over the answers.

Paper: Wang et al., "Self-Consistency Improves Chain of Thought Reasoning in Language Models"
(arXiv 2203.11171). It is the plain ensemble that RandOpt's K-vote must beat at equal passes per
example (one replication found self-consistency@50 above RandOpt K = 50 on Qwen2.5-1.5B/GSM8K).

Where we depart from the paper, and why:
- One sampling pass of max(K) completions per question serves every K: self-consistency@K votes
  over the first K samples of each question (the samples are i.i.d., so the first K are a fair
  draw of K). The tokens and FLOPs of a smaller K are the max-K pass's scaled by K / max(K), an
  estimate (the row's per-completion token counts are not stored); the max-K row is exact.
- Votes use corp's majority vote (empty answers dropped, ties to the earlier sample), the same
  rule as RandOpt's K-vote, so the two ensembles differ only in where their voters come from.
- The greedy base is reported beside it (one pass, temperature 0), so every report compares
  self-consistency@K with the base on the same test examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from corp.algorithms.stats import PerExample
from corp.config import RunConfig, parse_list
from corp.errors import CorpError
from corp.evaluate.voting import majority_vote
from corp.method import FIXED, SMALL, BenchAdapter, Method, ints, opt
from corp.runtime.context import cached_eval, run_evals
from corp.runtime.loop import Outputs, drive
from corp.runtime.runs import ReportRow

NAME = "self-consistency"  # the command, the report's method and its rows' prefix


@dataclass
class SelfConsistencyConfig(RunConfig):
    k: list[int] = field(default_factory=lambda: [1, 4, 16])
    """K values: samples per test question that are majority-voted, comma-separated (one pass of max K serves all)."""
    temperature: float = 0.7
    """Sampling temperature (> 0: K greedy samples would all be the same answer)."""

    not_options: ClassVar[tuple[str, ...]] = ("report_to",)  # no metrics rows: nothing to log
    options: ClassVar[dict[str, str]] = {"k": "vote_k"}  # a bare k is also pass@k's and top-K's

    def validate(self) -> SelfConsistencyConfig:
        super().validate()
        self.k = sorted(set(parse_list(self.k, int, "vote_k")))
        if not self.k or min(self.k) < 1:
            raise CorpError(f"--vote-k values must be >= 1, got {self.k}")
        if not 0 < self.temperature < math.inf:
            raise CorpError(f"--temperature must be > 0 and finite for self-consistency, got {self.temperature}")
        return self


def run_self_consistency(cfg: SelfConsistencyConfig, backend=None) -> dict:
    return drive(
        cfg, NAME, backend, lambda ctx: _self_consistency(cfg, ctx), needs=("test",), defines=None, host_copy=None
    )  # it only samples the base


def _self_consistency(cfg: SelfConsistencyConfig, ctx) -> Outputs:
    evals = run_evals(ctx)  # the run's evaluation cache: a rerun recomputes nothing
    test = ctx.splits["test"]
    ids = ctx.example_ids("test")
    greedy = cached_eval(ctx, evals, "test", None)
    kmax = max(cfg.k)
    sampled = cached_eval(ctx, evals, "test", None, n=kmax, temperature=cfg.temperature)
    rows = [
        ReportRow(
            "base",
            greedy["accuracy"],
            1,
            ctx.ledger().add_generation(greedy["prompt_tokens"], greedy["generated_tokens"]),
            0,
            PerExample(greedy["correct"], ids),
        )
    ]
    for k in cfg.k:
        # sampled answers are grouped per question: example j's samples are [j*kmax, (j+1)*kmax)
        correct = [
            int(bool(ctx.task.check(majority_vote(sampled["answers"][j * kmax : j * kmax + k]), ex)))
            for j, ex in enumerate(test)
        ]
        share = k / kmax
        led = ctx.ledger().add_generation(
            round(sampled["prompt_tokens"] * share), round(sampled["generated_tokens"] * share)
        )
        rows.append(
            ReportRow(
                f"{NAME}@{k}",
                sum(correct) / len(correct),
                k,
                led,
                0,
                PerExample(correct, ids),
                {"temperature": cfg.temperature, "tokens_estimated": k != kmax},
            )
        )
    # compared by accuracy whatever the task (a vote needs answers to compare), as it always was
    compare = [(r.method, "base") for r in rows[1:]]
    fields = {"temperature": cfg.temperature, "k": cfg.k}
    return Outputs(rows, compare, ids, fields, ctx.ledger(), model_name=cfg.model, measure="accuracy")


METHOD = Method(
    NAME,
    SelfConsistencyConfig,
    run_self_consistency,
    "Self-consistency@K: sample the base model K times per question "
    "(temperature 0.7), majority vote; greedy base beside it.",
    smoke={**SMALL, "k": "1,2"},
    bench=BenchAdapter(
        FIXED,
        rf"base|{NAME}@\d+",
        row_names=lambda o: ["base"] + [f"{NAME}@{k}" for k in ints(opt(o, SelfConsistencyConfig, "k"))],
        touched=lambda o, seed, units: 0,
    ),
)
