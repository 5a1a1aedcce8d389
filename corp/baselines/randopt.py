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

from corp import CorpError
from corp.config import RandOptConfig
from corp.evaluate.scorer import EvalCache, RunContext, ensure_population, open_run, rows_ledger, run_evals, score_specialists
from corp.evaluate.voting import majority_vote
from corp.runs import ReportRow, format_rows, write_report
from corp.stats import PerExample

MethodResult = ReportRow  # the older name of a report row


def evaluate_on_test(ctx: RunContext, specialists: list[tuple[int | None, float | None]], cache: EvalCache | None = None) -> dict[tuple, dict]:
    """Test-split rows for the base (None, None) and the given specialists; cached in evals.jsonl (resume)."""
    return score_specialists(ctx, specialists, "test", cache or run_evals(ctx), desc="test eval")


def vote_correct(ctx: RunContext, ranked_test_rows: list[dict]) -> list[int]:
    """Per test example: is the majority vote over the specialists' extracted answers (rank order breaks ties) correct?"""
    test = ctx.splits["test"]
    return [int(bool(ctx.task.check(majority_vote([r["answers"][j] for r in ranked_test_rows]), ex))) for j, ex in enumerate(test)]


def vote_accuracy(ctx: RunContext, ranked_test_rows: list[dict]) -> float:
    correct = vote_correct(ctx, ranked_test_rows)
    return sum(correct) / len(correct)


def randopt_results(ctx: RunContext, ranked: list[dict], top_k: list[int], cache: EvalCache | None = None) -> tuple[list[ReportRow], dict[tuple, dict]]:
    """Base, top-1 and top-K vote on the test split, from a ranked population, with per-example outcomes."""
    kmax = max(top_k)
    chosen = [(r["seed"], r["sigma"]) for r in ranked[:kmax]]
    test_rows = evaluate_on_test(ctx, [(None, None)] + chosen, cache)
    ids = ctx.example_ids("test")
    base_row = test_rows[(None, None)]
    ranked_test = [test_rows[spec] for spec in chosen]
    n_support = len(ctx.splits["support"])
    results = [ReportRow("base", base_row["accuracy"], 1, rows_ledger(ctx, [base_row]), 0, PerExample(base_row["correct"], ids))]
    top1 = ranked_test[0]
    results.append(ReportRow("randopt-top1", top1["accuracy"], 1, rows_ledger(ctx, [top1]), n_support, PerExample(top1["correct"], ids),
                             {"seed": top1["seed"], "sigma": top1["sigma"], "support_reward": ranked[0]["reward"]}))
    for k in top_k:
        if k == 1:
            continue
        correct = vote_correct(ctx, ranked_test[:k])
        results.append(ReportRow(f"randopt-vote@{k}", sum(correct) / len(correct), k, rows_ledger(ctx, ranked_test[:k]), n_support, PerExample(correct, ids)))
    return results, test_rows


def comparisons_vs_base(results: list[ReportRow]) -> list[tuple[str, str]]:
    return [(r.method, "base") for r in results if r.method != "base"]


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
        "selection_ledger": rows_ledger(ctx, ranked).to_dict(),
    }


def report_dict(ctx: RunContext, results: list[ReportRow], ranked: list[dict], compare: list[tuple[str, str]] | None = None, **extra) -> dict:
    """Write report.json (the shared schema, corp.runs.write_report) for a population method; return it."""
    return write_report(ctx.run_dir, ctx.method, ctx.cfg.model, ctx.cfg.task, results, comparisons_vs_base(results) if compare is None else compare,
                        ctx.example_ids("test"), population=population_summary(ctx, ranked), **extra)


def format_table(results: list[ReportRow], selection_flops: float | None = None, comparisons: list[dict] = ()) -> str:
    return format_rows(results, comparisons, selection_flops)


def population_line(ctx: RunContext) -> str:
    src = ctx.population_source or {}
    if src.get("rule") == "scored in this run" or not src:
        return ""
    return f"population: {src['used']} of {src['available']} specialists from {src['from']} (the {src['used']} {src['rule']})"


def run_randopt(cfg: RandOptConfig, backend=None) -> dict:
    with open_run(cfg, "randopt", backend) as ctx:
        k = max(cfg.top_k)
        ranked = ensure_population(ctx, keep=k, need=lambda rows: range(min(k, len(rows))))  # racing: the top K are scored in full
        if max(cfg.top_k) > len(ranked):
            raise CorpError(f"--top-k {max(cfg.top_k)} is larger than the population ({len(ranked)} specialists)")
        results, _ = randopt_results(ctx, ranked, cfg.top_k)
        report = report_dict(ctx, results, ranked)
    report["table"] = "\n".join(x for x in [format_table(results, report["population"]["selection_ledger"]["flops"], report["comparisons"]), population_line(ctx)] if x)
    return report
