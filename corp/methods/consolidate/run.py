"""`corp consolidate`: score (or reuse) a population, run CoRP, gate, save recipe + model, report.

The report table puts CoRP beside the base and RandOpt (top-1 and K-vote) on the same test split,
each with passes per test example, tokens and FLOPs from the compute ledger; the selection cost
(population scoring, plus CoRP's probe/validation evaluations) is reported separately.
With `--low-rank auto|R` (ours, corp/methods/consolidate/lowrank.py) the candidates are the low-rank
projections of m1/m2, the recipe carries the factors file, `--export-lora` writes a PEFT adapter,
and the report states the mode, how many matrices got a rank and LoRA vs full parameter counts.
"""

from __future__ import annotations

import math
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Sequence

from corp.algorithms.corp_operator.algebra import elite_set
from corp.algorithms.corp_operator.gate import kept_out_line, margin, margin_line
from corp.algorithms.corp_operator.stage1 import consolidate_stage1, reward_scale
from corp.algorithms.lowrank import FACTORS_FILE, LowRankDirection, factors_file
from corp.algorithms.perturb import Direction, ParamFilter, lowrank_rank
from corp.algorithms.recipe import make_recipe, produced_weights
from corp.algorithms.stats import PerExample
from corp.evaluate.population import (
    population_line,
    population_summary,
    randopt_results,
    sigma_edge_flags,
    test_passes,
)
from corp.evaluate.scorer import ensure_population
from corp.grids import edge_lines
from corp.methods.consolidate.config import COMMAND, PRODUCT, ConsolidateConfig
from corp.methods.consolidate.lowrank import (
    LowRankProjector,
    compress,
    exact_lora,
    export_lora,
    read_analysis,
    resolve_ranks,
)
from corp.methods.consolidate.stage2 import consolidate_stage2
from corp.runtime.backends.base import MODEL, PERTURBER
from corp.runtime.batched import direction_factored_for, direction_key, direction_rows
from corp.runtime.context import (
    EvalCache,
    RunContext,
    cached_eval,
    direction_fingerprint,
    row_scores,
    run_evals,
)
from corp.runtime.ledger import Passes, say_passes, seconds_per_example
from corp.runtime.loop import Outputs, drive
from corp.runtime.models import adapter_base
from corp.runtime.progress import progress_disabled
from corp.runtime.runs import ReportRow, format_rows

__all__ = ["RunScorer", "direction_fingerprint", "run_consolidate"]


def low_rank_line(lr: dict) -> str:
    if lr["mode"] == "off" and "exact_lora" in lr:
        ex = lr["exact_lora"]
        if not ex.get("lora_dir"):
            return f"low-rank: off (low-rank population); exact PEFT adapter {ex['lora_note']}"
        line = (
            f"low-rank: off; exact LoRA of the low-rank population "
            f"({ex['elites']} elite seed(s) x r={ex['noise_rank']}, "
            f"rank {ex['max_rank']} per matrix on {ex['matrices']} matrices, "
            f"LoRA parameters {ex['lora_parameters']:,}): {ex['lora_dir']}"
        )
        c = ex.get("compressed")
        if c:
            err = c["relative_frobenius_error"]
            line += f"; rank-{c['rank']} SVD adapter {c['lora_dir']} (relative Frobenius error {err:.3e})"
            if c.get("requested_rank"):
                line += f" (--lora-r {c['requested_rank']} asked for more than its real rank {c['rank']})"
        return line
    if lr["mode"] == "off":
        return "low-rank: off (full-rank update)"
    source = (
        f"r* from analyze-rank in {lr['rank_from']}"
        if lr["mode"] == "auto"
        else f"rank {lr['mode']} on every 2-D matrix"
    )
    share = lr["lora_parameters"] / max(1, lr["full_parameters"])
    line = (
        f"low-rank: {lr['mode']} ({source}): {lr['matrices_with_rank']} of "
        f"{lr['matrices_2d']} matrices with r > 0, LoRA parameters {lr['lora_parameters']:,} "
        f"vs {lr['full_parameters']:,} perturbed ({share:.2%}); other parameters unchanged"
    )
    if "lora_dir" in lr:
        line += f"; PEFT adapter: {lr['lora_dir']}" if lr["lora_dir"] else f"; PEFT adapter {lr['lora_note']}"
    return line


class RunScorer:
    """score(direction, split) -> per-example rewards (a PerExample carrying the split's example ids),
    cached in the run's evals.jsonl, keyed by what was evaluated and on exactly which examples (resume).

    On a low-rank population with the hf backend (`factored`), directions of seed components and
    merged terms are evaluated in the factored pass (`corp.runtime.batched.direction_rows`):
    the base weights stay in place, each merged term's factors are drawn once and every step size
    scales them, nothing is materialised (the saved model is, once). Same rows and keys as the dense
    path, up to floating-point rounding of the generations. Full-rank runs, and low-rank ones on vllm (its
    multi-LoRA population scores specialists, not directions), take the dense path."""

    def __init__(self, ctx: RunContext, cache: EvalCache):
        self.ctx, self.cache = ctx, cache
        self.ledger = ctx.ledger()  # what this consolidation needs (probe, validation, support halves), cached or not
        self._counted: set[str] = set()
        self.factored = direction_factored_for(ctx) is not None

    def prepare(self, directions: Sequence[Direction | None], split: str) -> None:
        """Evaluate the uncached ones of `directions` on `split` together (factored pass only: the
        step sizes of one merged term become row groups of one batched pass); a no-op otherwise."""
        if not self.factored:
            return
        todo = {}
        for d in directions:
            if d is not None:
                todo.setdefault(direction_key(self.ctx, d, split), d)
        todo = [d for key, d in todo.items() if key not in self.cache]
        for j, row in direction_rows(self.ctx, todo, split):
            self.cache.put({**row, "n_components": len(todo[j].components)})

    def row(self, direction: Direction | None, split: str) -> dict:
        self.prepare([direction], split)
        row = cached_eval(
            self.ctx, self.cache, split, direction, n_components=len(direction.components) if direction else 0
        )
        if split != "test" and row["key"] not in self._counted:
            self._counted.add(row["key"])
            self.ledger.add_generation(row["prompt_tokens"], row["generated_tokens"])
        return row

    def __call__(self, direction: Direction | None, split: str) -> PerExample:
        return row_scores(self.row(direction, split), self.ctx.example_ids(split))

    def example_ids(self, direction: Direction | None, split: str) -> list[str]:
        """The ids of the examples `self(direction, split)` was computed on, in order (the gate checks both sides)."""
        return self(direction, split).example_ids

    def release(self) -> None:
        """Free what the factored pass keeps between evaluations (the last directions' factors)."""
        if self.factored:
            direction_factored_for(self.ctx).release_factors()

    def cache_prefix(self, direction: Direction | None) -> None:
        # an optimisation of the dense path where the Perturber writes the engine's own weights (hf); an engine that
        # keeps its weights elsewhere (vLLM, Ray) materialises every direction itself, and the factored pass writes
        # no weights, so a prefix would only cost a copy of the model
        if self.ctx.backend.shares_weights and not self.factored:
            self.ctx.backend.perturber.cache_prefix(direction)


def _race_keep(cfg: ConsolidateConfig) -> int:
    """How many specialists a race must score in full at least: the widest elite set (quantile
    min(q) of N, one more for the interpolated threshold) and RandOpt's report rows' top K."""
    return max(max(cfg.top_k), math.ceil((1.0 - min(cfg.quantiles)) * cfg.population) + 1)


def _used_rows(cfg: ConsolidateConfig, rows: list[dict]) -> set[int]:
    """Positions (in `rows`) of every specialist CoRP weights or the report's RandOpt rows use: the
    elites at each quantile (on the rewards the merge rules see) and the top K."""
    r = reward_scale([row["reward"] for row in rows])
    return set().union(*(elite_set(r, q) for q in cfg.quantiles)) | set(range(min(max(cfg.top_k), len(rows))))


def _exact_lora(cfg: ConsolidateConfig, ctx: RunContext, direction: Direction, params, scheme: str):
    """CoRP's update of a low-rank population as a PEFT adapter in RUN_DIR/lora/, exactly (no
    truncation), and with --lora-r an SVD-compressed one in RUN_DIR/lora-rank-R/: the report's
    fields, and the export that writes them (the driver runs it)."""
    lora_dir = ctx.run_dir / "lora"
    exact = exact_lora(direction, params, scheme)
    if exact.is_zero():
        return {"lora_dir": None, "lora_note": "not written: CoRP abstained, so the output is the base model"}, [
            _clear_lora
        ]
    base = adapter_base(ctx.model_id, ctx.backend.model_path)
    model = ctx.backend.model
    ranks = exact.ranks
    out = {
        "lora_dir": str(lora_dir),
        "noise_scheme": scheme,
        "noise_rank": lowrank_rank(scheme),
        "elites": max(ranks.values()) // lowrank_rank(scheme),
        "max_rank": max(ranks.values()),
        "matrices": len(ranks),
        "lora_parameters": exact.lora_parameters(),
    }
    exports = [_clear_lora, lambda run_dir: export_lora(exact, model, run_dir / "lora", base)]
    if cfg.lora_rank:
        small, err = compress(exact, cfg.lora_rank)
        where = ctx.run_dir / f"lora-rank-{cfg.lora_rank}"
        out["compressed"] = {"lora_dir": str(where), "lora_parameters": small.lora_parameters(), **err}
        exports.append(lambda run_dir: export_lora(small, model, where, base))
        if "requested_rank" in err:
            warnings.warn(
                f"--lora-r {cfg.lora_rank} is above the exact adapter's rank: '{where}' holds the update at its "
                f"real rank {err['rank']}, uncompressed (relative Frobenius error {err['relative_frobenius_error']:.1e})"
            )
    return out, exports


def _clear_lora(run_dir) -> None:
    """Remove the adapters an earlier run here exported (corp's own, stale now)."""
    shutil.rmtree(run_dir / "lora", ignore_errors=True)
    for old in run_dir.glob("lora-rank-*"):
        if (old / "adapter_config.json").exists():
            shutil.rmtree(old, ignore_errors=True)


def run_consolidate(cfg: ConsolidateConfig, backend=None) -> dict:
    needs = ("support", "probe", "validation", "test")
    # its host copy is written only once it lets its engine go (_consolidate's release_engine)
    return drive(cfg, COMMAND, backend, lambda ctx: _consolidate(cfg, ctx), needs=needs, host_copy="after")


def _consolidate(cfg: ConsolidateConfig, ctx: RunContext) -> Outputs:
    support = ctx.splits["support"]
    ctx.splits["support_select"], ctx.splits["support_gate"] = (
        support[: len(support) // 2],
        support[len(support) // 2 :],
    )
    progress = not progress_disabled()
    rank_dir = str(cfg.rank_from or cfg.from_run or ctx.run_dir) if cfg.low_rank == "auto" else None
    analysed = read_analysis(rank_dir) if rank_dir else None  # before scoring: no analysis is a quick error
    t0 = time.perf_counter()
    ranked = ensure_population(ctx, keep=_race_keep(cfg), need=lambda rows: _used_rows(cfg, rows))
    seconds = {"population": time.perf_counter() - t0}  # where the time went (benchmarks/bench_stages.py)
    # order does not matter to CoRP up to float rounding; fix it as it always was (by "<seed>:<sigma>"), so results
    # reproduce
    population = sorted(ranked, key=lambda r: f"{int(r['seed'])}:{float(r['sigma'])!r}:support")
    evals = run_evals(ctx)
    _say_rest(cfg, ctx, ranked, evals)
    scorer = RunScorer(ctx, evals)
    ctx.backend.require(PERTURBER, "corp consolidate (Gram matrix, merged directions)")
    ctx.backend.require(MODEL, "corp consolidate (it saves the consolidated model)")
    params = [(n, p.shape) for n, p in ctx.backend.perturber.params]
    projector = (
        LowRankProjector(resolve_ranks(cfg.low_rank, params, analysed, rank_dir), params, progress)
        if cfg.low_rank != "off"
        else None
    )
    scheme = ctx.backend.perturber.scheme  # the population's noise scheme: the Gram matrix regenerates its noise
    # the Perturber builds the step search's merged M in advance for the dense path where it writes the engine's
    # weights; the factored pass needs none, and an engine with weights of its own (vLLM, Ray) builds them itself
    dense = ctx.backend.perturber if ctx.backend.shares_weights and not scorer.factored else None
    result = consolidate_stage1(
        [r["reward"] for r in population],
        [r["seed"] for r in population],
        [r["sigma"] for r in population],
        params,
        scorer,
        cfg,
        progress=progress,
        project=projector,
        gram_cache=ctx.run_dir,
        scheme=scheme,
        perturber=dense,
    )
    seconds.update(result.seconds)
    if cfg.rounds > 0:
        if dense is not None:  # stage 2 builds its own merged directions
            dense.release_merged()
        t0 = time.perf_counter()
        result = consolidate_stage2(
            result,
            params,
            scorer,
            cfg,
            seed=cfg.seed,
            progress=progress,
            gram_cache=ctx.run_dir,
            scheme=scheme,
            perturber=dense,
        )
        seconds["stage2"] = time.perf_counter() - t0

    # the test rows first: they move the weights, and the deployed model is then set once, for the driver to save
    tested = _test_rows(cfg, ctx, result, ranked, evals, scorer, seconds)
    if ctx.built_backend:  # nothing generates after the test rows: the saved model materialises beside no engine
        ctx.backend.release_engine()
    deployed = _deploy(cfg, ctx, result, projector, params, scheme, rank_dir, seconds)
    if dense is not None:  # the deployed M, kept from the gate through the test rows and the deploy
        dense.release_merged()
    return _consolidate_report(cfg, ctx, result, ranked, tested, scorer, deployed, seconds)


def _say_rest(cfg: ConsolidateConfig, ctx: RunContext, ranked: list[dict], evals: EvalCache) -> None:
    """One line once the population is scored: the passes CoRP's later stages will generate and their time at
    the population's rate, so minutes of step search, gates and test rows are not silence (issue 56). Rows the
    run's cache holds are left out (a resume); stage 2 stops early, so its count is a bound."""
    n = {s: len(ctx.splits[s]) for s in ("probe", "validation", "test", "support_select", "support_gate")}
    done = Counter(r["split"] for r in evals.rows.values() if r.get("kind") == "direction")  # an earlier attempt's

    def base(split: str) -> int:  # the base's row on `split`, unless cached
        return int(direction_key(ctx, None, split) not in evals)

    grid = len(cfg.merge_rules) * len(cfg.quantiles) * len(cfg.betas) * len(cfg.alphas)
    search = max(0, grid - done["probe"]) + base("probe")  # every candidate, and the base for the probe table
    gates = max(0, len(cfg.merge_rules) - done["validation"]) + base("validation")  # each rule's best vs the base
    tests = test_passes(ctx, ranked, cfg.top_k, evals) + max(0, 1 - done["test"])  # RandOpt's, CoRP's (or the kept-out)
    stages = [Passes("step search", search, search * n["probe"]), Passes("gates", gates, gates * n["validation"])]
    if cfg.rounds > 0:  # a round: its local population and step search on one support half, 2 gates on each side
        rounds = cfg.rounds * (cfg.local_population + grid + 4) + 1  # + the final validation gate
        each = (cfg.local_population + grid) * n["support_select"] + 2 * (n["support_gate"] + n["probe"])
        stages.append(Passes("stage 2", rounds, cfg.rounds * each + n["validation"], at_most=True))
    stages.append(Passes("test rows", tests, tests * n["test"]))
    say_passes(COMMAND, stages, seconds_per_example(ranked), "at the population's rate")


def _deploy(cfg: ConsolidateConfig, ctx: RunContext, result, projector, params, scheme: str, rank_dir, seconds) -> dict:
    """The deployed model as the driver will write it: the recipe (with its factors file when
    low-rank), the LoRA exports where asked, and the low-rank part of the report."""
    t0 = time.perf_counter()
    made_by = {
        "method": PRODUCT,
        "accepted": result.accepted,
        "reason": result.reason,
        "candidate": result.best.name,
        "gate": result.gate.to_dict(),
        "run_dir": str(ctx.run_dir),
        "low_rank": cfg.low_rank,
    }
    low_rank_entry, files = None, {FACTORS_FILE: None}  # no factors: a stale file from an earlier run is removed
    if isinstance(result.direction, LowRankDirection):
        entry, files[FACTORS_FILE] = factors_file(result.direction)
        low_rank_entry = {"mode": cfg.low_rank, "rank_from": rank_dir, **entry}
    ctx.backend.set_direction(result.direction)
    recipe = make_recipe(
        cfg.model,
        ctx.model_id,
        ctx.weights_hash,
        ParamFilter(cfg.include, cfg.exclude),
        result.direction,
        made_by,
        low_rank_entry,
        scheme=scheme,
        produced=produced_weights(ctx.backend.model),
    )  # what apply must rebuild
    seconds["save"] = time.perf_counter() - t0  # the driver adds its writes' seconds
    low_rank_report, exports = _low_rank_exports(cfg, ctx, result, projector, params, scheme, rank_dir)
    return {"recipe": recipe, "files": files, "exports": exports, "low_rank": low_rank_report}


def _low_rank_exports(cfg: ConsolidateConfig, ctx: RunContext, result, projector, params, scheme, rank_dir):
    """The low-rank part of the report and the LoRA exports (--export-lora) the driver writes."""
    low_rank_report: dict = {"mode": cfg.low_rank}
    exports = []
    if projector is not None:
        low_rank_report.update(rank_from=rank_dir, **projector.summary(ctx.backend.perturber.n_selected))
        if cfg.export_lora:
            exports.append(lambda run_dir: shutil.rmtree(run_dir / "lora", ignore_errors=True))
            if isinstance(result.direction, LowRankDirection) and not result.direction.is_zero():
                low_rank_report["lora_dir"] = str(ctx.run_dir / "lora")
                direction, model = result.direction, ctx.backend.model
                base = adapter_base(ctx.model_id, ctx.backend.model_path)
                exports.append(lambda run_dir: export_lora(direction, model, run_dir / "lora", base))
            else:
                low_rank_report["lora_dir"] = None
                low_rank_report["lora_note"] = (
                    "not written: CoRP abstained (or every rank is 0), so the output is the base model"
                )
    elif cfg.export_lora:
        low_rank_report["exact_lora"], exports = _exact_lora(cfg, ctx, result.direction, params, scheme)
    return low_rank_report, exports


def _test_rows(cfg: ConsolidateConfig, ctx: RunContext, result, ranked, evals, scorer, seconds) -> tuple:
    """The test split's rows: base, RandOpt top-1 / K-vote, CoRP, and the gate's candidate."""
    t0 = time.perf_counter()
    results, _ = randopt_results(ctx, ranked, cfg.top_k, evals)
    corp_row = scorer.row(result.direction, "test")
    # what the gate kept out, measured on test for the report only (never charged, never a choice): with the
    # base's row it says whether keeping the base cost or saved test accuracy (issue 55)
    cand_row = corp_row if result.accepted else scorer.row(result.best.direction, "test")
    scorer.release()
    seconds["test"] = time.perf_counter() - t0
    return results, corp_row, cand_row


def _consolidate_report(
    cfg: ConsolidateConfig, ctx: RunContext, result, ranked, tested: tuple, scorer, deployed: dict, seconds
) -> Outputs:
    """Base, RandOpt top-1 / K-vote and CoRP on test, each with per-example outcomes and paired
    comparisons; with the deployed model, what the driver writes (the report and its table)."""
    results, corp_row, cand_row = tested
    corp_ledger = ctx.ledger().add_generation(corp_row["prompt_tokens"], corp_row["generated_tokens"])
    label = PRODUCT if result.accepted else f"{PRODUCT} (abstained=base)"
    labelled = sum(len(ctx.splits[s]) for s in ("support", "probe", "validation"))
    results.append(
        ReportRow(
            label,
            sum(corp_row["correct"]) / len(corp_row["correct"]),
            1,
            corp_ledger,
            labelled,
            PerExample(corp_row["correct"], ctx.example_ids("test")),
            rewards=PerExample(corp_row["rewards"], ctx.example_ids("test")),
        )
    )
    compare = [(label, r.method) for r in results if r.method != label] + [
        (r.method, "base") for r in results if r.method not in ("base", label)
    ]
    consolidation_cost = scorer.ledger.to_dict()
    low_rank_report = deployed["low_rank"]
    fields = dict(
        population=population_summary(ctx, ranked),
        # the step search's alpha, q, beta and RandOpt's top-1 sigma where they hit their grid's edge (issue 55)
        edge_flags=cfg.edge_flags(result.best.params) + sigma_edge_flags(ctx, ranked),
        labelled_examples_note=(
            f"CoRP used {labelled} {_what_labelled(ctx)} (support {len(ctx.splits['support'])} "
            f"+ probe {len(ctx.splits['probe'])} + validation "
            f"{len(ctx.splits['validation'])}); RandOpt used the support split only"
        ),
        **{
            PRODUCT: {
                **_corp_section(cfg, result, low_rank_report, consolidation_cost, seconds),
                "candidate_test": {  # the gate's candidate (the deployed model when it passed) beside the base
                    "candidate": result.best.name,
                    "deployed": result.accepted,
                    "accuracy": sum(cand_row["correct"]) / len(cand_row["correct"]),
                    "base_accuracy": results[0].accuracy,
                },
            }
        },
    )
    return Outputs(
        results,
        compare,
        ctx.example_ids("test"),
        fields,
        model=(ctx.backend.model, ctx.backend.tokenizer),
        recipe=deployed["recipe"],
        table=lambda report: _table(cfg, ctx, result, results, report, consolidation_cost, low_rank_report),
        files=deployed["files"],
        exports=deployed["exports"],
        timings=(PRODUCT, "seconds"),
    )


def _what_labelled(ctx: RunContext) -> str:
    """What the examples CoRP used were: labelled, or, without gold answers, prompts the reward scored."""
    return "prompts scored by the reward (0 labelled)" if ctx.measure == "reward" else "labelled examples"


def _corp_section(cfg: ConsolidateConfig, result, low_rank_report, consolidation_cost, seconds) -> dict:
    """report.json's `corp`: the gate's decision and everything behind it (probe table, stages, costs)."""
    return {
        "accepted": result.accepted,
        "reason": result.reason,
        "candidate": result.best.name,
        "n_components": len(result.direction.components),
        "gate_validation": result.gate.to_dict(),
        "gate": margin(result.gate.to_dict()),
        "pass1_gate_validation": result.pass1_gate.to_dict() if result.pass1_gate else None,
        "probe_table": result.probe_table,
        "stage1": result.stage1,
        "stage2_rounds": result.rounds,
        "compat": cfg.compat,
        "low_rank": low_rank_report,
        "consolidation_ledger": consolidation_cost,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }


def compat_line(compat: str, chosen: dict | None) -> str:
    """The table's line on the compatibility terms: how far the exact Gram's choice is from the seed-orthogonal
    approximation, or that the approximation was used (no Gram to compare with)."""
    if compat != "exact":
        return f"compatibility: {compat} approximation (no Gram matrix; --compat exact computes it)"
    if not chosen:
        return ""
    d = chosen["compat_disagreement"]
    return (
        "compatibility (exact) vs seed-orthogonal approximation, chosen (q, beta): max |alignment diff| "
        f"{d['max_abs_alignment_diff']:.2e}, L1 diff of pass-2 weights {d['w2_l1_diff']:.2e}"
    )


def _table(
    cfg: ConsolidateConfig, ctx: RunContext, result, results, report, consolidation_cost, low_rank_report
) -> str:
    """The terminal table: the rows, then one line each for the population, CoRP's own evaluations,
    the gate, the labelled data, the compatibility check of the chosen (q, beta) and the low-rank
    analysis (lines with nothing to say are left out)."""
    g = result.gate
    chosen = next(
        (st for st in result.stage1 if st["q"] == result.best.params["q"] and st["beta"] == result.best.params["beta"]),
        None,
    )
    return "\n".join(
        x
        for x in [
            format_rows(results, report["comparisons"], report["population"]["selection_ledger"]["flops"], ctx.measure),
            population_line(ctx),
            "CoRP consolidation evaluations (probe/validation/support "
            f"halves): {consolidation_cost['flops']:.3e} FLOPs",
            f"gate (validation, n={g.n}): candidate {g.candidate_score:.3f} "
            f"vs base {g.base_score:.3f}; {result.reason}",
            margin_line(g.to_dict()),
            kept_out_line(report[PRODUCT]["candidate_test"]) if not result.accepted else "",
            report["labelled_examples_note"],
            compat_line(cfg.compat, chosen),
            low_rank_line(low_rank_report),
            *edge_lines(report["edge_flags"]),
        ]
        if x
    )
