"""`corp score`: score a population of seeded specialists on the support split, nothing else.

The population (`population.jsonl`) is the shared artefact that RandOpt, `analyze-rank` and CoRP
read with `--from-run`; scoring it alone lets one expensive pass serve all of them.
"""

from __future__ import annotations

from corp.config import PopulationConfig
from corp.errors import CorpError
from corp.evaluate.calibration import noise_line
from corp.evaluate.racing import RACED
from corp.evaluate.scorer import base_line, ensure_population, selection_ledger
from corp.method import SMALL, Method, num
from corp.runtime.context import RunContext
from corp.runtime.loop import Outputs, drive

NAME = "score"  # the command and the report's method


def run_score(cfg: PopulationConfig, backend=None) -> dict:

    if cfg.race != "off" and cfg.race_keep < 1:
        raise CorpError(
            "corp score --race halving needs --race-keep: how many specialists the method that reads this population "
            "will use (RandOpt's largest K, CoRP's elite count)"
        )
    return drive(cfg, NAME, backend, _score, needs=("support",), host_copy=None)  # it only scores


def _score(ctx: RunContext) -> Outputs:
    ranked = ensure_population(ctx)
    rewards = sorted(r["reward"] for r in ranked)
    population = {
        "n": len(ranked),
        "support_examples": len(ctx.splits["support"]),
        "reward_best": rewards[-1],
        "reward_median": rewards[len(rewards) // 2],
        "reward_worst": rewards[0],
        "source": getattr(ctx, "population_source", None),
        "raced_out": sum(r.get("kind") == RACED for r in ranked),
        "selection_ledger": selection_ledger(ctx, ranked).to_dict(),  # the noise-scale calibration included
        "noise_scales": noise_line(ctx.population_source),
    }
    # a report with no rows (no test split); its measure stays "accuracy" even on a reward-only task, as it was
    return Outputs([], [], None, {"population": population}, measure="accuracy")


def summary(report: dict) -> str:
    pop = report.get("population") or {}
    lines = (pop.get("noise_scales"), base_line(pop.get("source")))
    return "\n".join(
        [
            f"{pop.get('n')} specialists; support reward best {num(pop.get('reward_best'))}, median "
            f"{num(pop.get('reward_median'))}, worst {num(pop.get('reward_worst'))}",
            *(line for line in lines if line),
            f"run directory: {report.get('run_dir')}",
        ]
    )


METHOD = Method(
    NAME,
    PopulationConfig,
    run_score,
    "Score a population of perturbed specialists on the support split (population.jsonl).",
    smoke={**SMALL, "population": 3, "sigmas": "0.05"},
    summary=summary,
)
