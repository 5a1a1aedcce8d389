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

from dataclasses import dataclass

from corp.bench.ledger import FLOPS_FORMULA, Ledger
from corp.config import RandOptConfig
from corp.evaluate.scorer import RunContext, ensure_population, row_key, rows_ledger, score_specialists, setup_run
from corp.evaluate.voting import majority_vote
from corp.runs import write_json


@dataclass
class MethodResult:
    """One row of a report table: a model (or ensemble) evaluated on the test split."""

    method: str
    accuracy: float
    passes_per_example: int
    ledger: Ledger
    detail: dict | None = None

    def to_dict(self) -> dict:
        return {"method": self.method, "accuracy": self.accuracy, "passes_per_example": self.passes_per_example, **self.ledger.to_dict(), **(self.detail or {})}


def evaluate_on_test(ctx: RunContext, specialists: list[tuple[int | None, float | None]]) -> dict[str, dict]:
    """Test-split rows for the base (None, None) and the given specialists; resumable (test_evals.jsonl)."""
    return score_specialists(ctx, specialists, "test", ctx.run_dir / "test_evals.jsonl", desc="test eval")


def vote_accuracy(ctx: RunContext, ranked_test_rows: list[dict]) -> float:
    """Majority vote over the specialists' extracted answers (rank order breaks ties), checked per example."""
    test = ctx.splits["test"]
    correct = 0
    for j, ex in enumerate(test):
        voted = majority_vote([r["answers"][j] for r in ranked_test_rows])
        correct += bool(ctx.task.check(voted, ex))
    return correct / len(test)


def randopt_results(ctx: RunContext, ranked: list[dict], top_k: list[int]) -> tuple[list[MethodResult], dict[str, dict]]:
    """Base, top-1 and top-K vote on the test split, from a ranked population."""
    kmax = max(top_k)
    chosen = [(r["seed"], r["sigma"]) for r in ranked[:kmax]]
    test_rows = evaluate_on_test(ctx, [(None, None)] + chosen)
    base_row = test_rows[row_key(None, None, "test")]
    ranked_test = [test_rows[row_key(s, sg, "test")] for s, sg in chosen]
    results = [MethodResult("base", base_row["accuracy"], 1, rows_ledger(ctx, [base_row]))]
    top1 = ranked_test[0]
    results.append(MethodResult("randopt-top1", top1["accuracy"], 1, rows_ledger(ctx, [top1]), {"seed": top1["seed"], "sigma": top1["sigma"], "support_reward": ranked[0]["reward"]}))
    for k in top_k:
        if k == 1:
            continue
        results.append(MethodResult(f"randopt-vote@{k}", vote_accuracy(ctx, ranked_test[:k]), k, rows_ledger(ctx, ranked_test[:k])))
    return results, test_rows


def _sum_counts(dicts) -> dict:
    """Sum per-specialist counters (e.g. code sandbox pass/fail/timeout/crash/sandbox_error)."""
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + int(v)
    return total


def report_dict(ctx: RunContext, results: list[MethodResult], ranked: list[dict], **extra) -> dict:
    sel = rows_ledger(ctx, ranked)
    return {
        "method": ctx.method,
        "model": ctx.cfg.model,
        "task": ctx.cfg.task,
        "run_dir": str(ctx.run_dir),
        "n_test": len(ctx.splits["test"]),
        "population": {
            "n": len(ranked),
            "support_examples": len(ctx.splits["support"]),
            "reward_best": ranked[0]["reward"],
            "reward_median": sorted(r["reward"] for r in ranked)[len(ranked) // 2],
            "reward_errors": sum(r.get("reward_errors", 0) for r in ranked),
            "program_status_counts": _sum_counts(r.get("status_counts") or {} for r in ranked),
            "selection_ledger": sel.to_dict(),
        },
        "test": [r.to_dict() for r in results],
        "flops_formula": FLOPS_FORMULA,
        **extra,
    }


def format_table(results: list[MethodResult], selection_flops: float | None = None) -> str:
    lines = [f"{'method':<18} {'test acc':>8} {'passes/ex':>9} {'test tokens':>12} {'test FLOPs':>11}"]
    for r in results:
        lines.append(f"{r.method:<18} {r.accuracy:>8.3f} {r.passes_per_example:>9d} {r.ledger.inference_tokens:>12d} {r.ledger.flops:>11.3e}")
    if selection_flops is not None:
        lines.append(f"(population scoring on the support split: {selection_flops:.3e} FLOPs, shared by every non-base row)")
    lines.append(FLOPS_FORMULA)
    return "\n".join(lines)


def run_randopt(cfg: RandOptConfig) -> dict:
    ctx = setup_run(cfg, "randopt")
    ranked = ensure_population(ctx)
    if max(cfg.top_k) > len(ranked):
        from corp import CorpError

        raise CorpError(f"--top-k {max(cfg.top_k)} is larger than the population ({len(ranked)} specialists)")
    results, _ = randopt_results(ctx, ranked, cfg.top_k)
    report = report_dict(ctx, results, ranked)
    write_json(ctx.run_dir / "report.json", report)
    report["table"] = format_table(results, rows_ledger(ctx, ranked).flops)
    return report
