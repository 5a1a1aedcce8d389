"""What a ranked population scores on the test split, and how reports describe it.

RandOpt's rows (base, top-1, top-K majority vote; Gan & Isola, arXiv 2603.12228) are computed
here, below the algorithm packages, because CoRP's report carries them beside its own row
(corp.methods.consolidate.run) and peers do not import each other's internals.
"""

from __future__ import annotations

from corp.algorithms.stats import PerExample
from corp.config import flag
from corp.evaluate.calibration import calibration_flag, noise_line
from corp.evaluate.scorer import base_line, rows_ledger, score_specialists, selection_ledger
from corp.evaluate.voting import majority_vote
from corp.grids import edge_flag
from corp.runtime.context import EvalCache, RunContext, eval_identity, eval_key, run_evals, specialist_what
from corp.runtime.runs import ReportRow


def evaluate_on_test(
    ctx: RunContext, specialists: list[tuple[int | None, float | None]], cache: EvalCache | None = None
) -> dict[tuple, dict]:
    """Test-split rows for the base (None, None) and the given specialists; cached in evals.jsonl (resume)."""
    return score_specialists(ctx, specialists, "test", cache or run_evals(ctx), desc="test eval")


def test_passes(ctx: RunContext, ranked: list[dict], top_k: list[int], cache: EvalCache) -> int:
    """How many test passes `randopt_results` has still to generate: the base and the top K, less the
    rows `cache` holds (a resumed run's, or the bench's shared ones). What the methods' estimate counts."""
    context, ids = ctx.eval_context(), ctx.example_ids("test")
    wanted = [(None, None)] + [(r["seed"], r["sigma"]) for r in ranked[: max(top_k)]]
    return sum(eval_key(eval_identity(context, specialist_what(s, sg), ids)) not in cache for s, sg in wanted)


def vote_correct(ctx: RunContext, ranked_test_rows: list[dict]) -> list[int]:
    """Per test example: is the majority vote over the specialists' extracted answers (rank order breaks ties) correct?"""
    test = ctx.splits["test"]
    return [
        int(bool(ctx.task.check(majority_vote([r["answers"][j] for r in ranked_test_rows]), ex)))
        for j, ex in enumerate(test)
    ]


def vote_rewards(ranked_test_rows: list[dict]) -> list[float]:
    """Per test example: the reward of the vote's answer, the completion of the highest-ranked specialist
    that gave it (the top-ranked one's when no specialist gave an answer); what a task without gold
    answers reports for a vote."""
    out = []
    for j in range(len(ranked_test_rows[0]["rewards"])):
        answers = [r["answers"][j] for r in ranked_test_rows]
        voted = majority_vote(answers)
        out.append(ranked_test_rows[answers.index(voted) if voted is not None else 0]["rewards"][j])
    return out


def randopt_results(
    ctx: RunContext, ranked: list[dict], top_k: list[int], cache: EvalCache | None = None
) -> tuple[list[ReportRow], dict[tuple, dict]]:
    """Base, top-1 and top-K vote on the test split, from a ranked population, with per-example outcomes."""
    kmax = max(top_k)
    chosen = [(r["seed"], r["sigma"]) for r in ranked[:kmax]]
    test_rows = evaluate_on_test(ctx, [(None, None)] + chosen, cache)
    ids = ctx.example_ids("test")
    base_row = test_rows[(None, None)]
    ranked_test = [test_rows[spec] for spec in chosen]
    n_support = len(ctx.splits["support"])
    results = [
        ReportRow(
            "base",
            base_row["accuracy"],
            1,
            rows_ledger(ctx, [base_row]),
            0,
            PerExample(base_row["correct"], ids),
            rewards=PerExample(base_row["rewards"], ids),
        )
    ]
    top1 = ranked_test[0]
    results.append(
        ReportRow(
            "randopt-top1",
            top1["accuracy"],
            1,
            rows_ledger(ctx, [top1]),
            n_support,
            PerExample(top1["correct"], ids),
            {"seed": top1["seed"], "sigma": top1["sigma"], "support_reward": ranked[0]["reward"]},
            PerExample(top1["rewards"], ids),
        )
    )
    for k in top_k:
        if k == 1:
            continue
        correct = vote_correct(ctx, ranked_test[:k])
        results.append(
            ReportRow(
                f"randopt-vote@{k}",
                sum(correct) / len(correct),
                k,
                rows_ledger(ctx, ranked_test[:k]),
                n_support,
                PerExample(correct, ids),
                rewards=PerExample(vote_rewards(ranked_test[:k]), ids),
            )
        )
    return results, test_rows


def _sum_counts(dicts) -> dict:
    """Sum per-specialist counters (e.g. code sandbox pass/fail/timeout/crash/sandbox_error)."""
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + int(v)
    return total


def population_summary(ctx: RunContext, ranked: list[dict]) -> dict:
    return {
        "n": len(ranked),
        "support_examples": len(ctx.splits["support"]),
        "source": ctx.population_source,
        "reward_best": ranked[0]["reward"],
        "reward_median": sorted(r["reward"] for r in ranked)[len(ranked) // 2],
        "reward_errors": sum(r.get("reward_errors", 0) for r in ranked),
        "program_status_counts": _sum_counts(r.get("status_counts") or {} for r in ranked),
        "selection_ledger": selection_ledger(ctx, ranked).to_dict(),  # the noise-scale calibration included
        "noise_scales": noise_line(ctx.population_source),
    }


def sigma_edge_flags(ctx: RunContext, ranked: list[dict]) -> list[dict]:
    """report.json's flag when RandOpt's top-1 specialist has the smallest or largest noise scale of the
    population (corp.grids): a scale beyond the grid may be better."""
    src = ctx.population_source or {}
    wanted = src.get("from_sigmas")
    grid = wanted or src.get("sigmas") or list(getattr(ctx.cfg, "sigmas", None) or [])
    found = ranked and edge_flag("top-1 sigma", ranked[0]["sigma"], grid, flag("from_sigmas" if wanted else "sigmas"))
    # a calibration that never reached its target used a bound of its search: that is an edge too
    return [f for f in (found, calibration_flag(src.get("calibration"))) if f]


def population_line(ctx: RunContext) -> str:
    """The report's lines on where the population came from (another run's) and its noise scales."""
    src = ctx.population_source or {}
    taken = (
        f"population: {src['used']} of {src['available']} specialists from {src['from']} (the {src['used']} {src['rule']})"
        if src and src.get("rule") != "scored in this run"
        else ""
    )
    return "\n".join(x for x in (taken, noise_line(src), base_line(src)) if x)
