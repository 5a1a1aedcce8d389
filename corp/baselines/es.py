"""ES: iterative OpenES in weight space on the population scorer.

Paper: Qiu et al., "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning"
(arXiv 2509.24372).

Each iteration t scores N specialists centre_t + sigma eps(seed_i) (or +- pairs with
`--antithetic`) on the support split, greedy, turns their mean rewards into fitness f (z-scored, or
centred ranks in [-0.5, 0.5]) and moves the centre by (alpha / N) sum_i f_i eps_i. An ES run is
therefore a list of seed components: the centre is base + Direction(components so far), each
component (seed_i, sigma, coef = alpha f_i / (N sigma)) contributes coef * sigma * eps = alpha f_i eps / N.
The centre is kept as an fp32 master copy (the Perturber's pristine copy is replaced by it), and is
updated by adding components in order with `Direction.add_to`, the same floating-point operations
`Perturber.apply(Direction(all components))` performs on the base: the saved recipe materialises
the final model bit-exactly, and a resumed run rebuilds the centre from its checkpointed components.

Where we depart from the paper, and why:
- The step is alpha / N * sum f_i eps_i, as the paper's code does (1/sigma absorbed into alpha);
  METHODS.md writes alpha / (N sigma). With the paper's alpha = 5e-4 and sigma = 1e-3, the
  1/sigma form would move every weight by ~0.1 per step.
- Antithetic pairs and centred-rank fitness are options (the paper uses plain sampling, z-scores).
- Defaults are CPU-sized (N = 8, 4 iterations, 64 support examples) instead of N = 30 and hundreds
  of iterations; the paper's scale is a matter of flags.
- The centre's own support reward is scored every iteration (`--skip-centre-eval` turns it off) for
  the metrics; it costs one more evaluation per iteration, counted in the ledger.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from corp import CorpError
from corp.bench.ledger import FLOPS_FORMULA
from corp.config import RunConfig
from corp.evaluate.scorer import check_meta, evaluate, evaluate_current, population_meta, result_row, setup_run
from corp.perturb import SCHEME_VERSION, Component, Direction
from corp.runs import append_jsonl, read_json, read_jsonl, write_json


@dataclass
class ESConfig(RunConfig):
    iterations: int = 4
    """Number of ES iterations (centre updates)."""
    population: int = 8
    """N: specialists scored per iteration (with --antithetic, N/2 seeds, each +-)."""
    sigma: float = 1e-3
    """Noise scale of the specialists."""
    alpha: float = 5e-4
    """Step size: centre += alpha / N * sum_i f_i eps_i."""
    antithetic: bool = False
    """Use antithetic pairs (+eps, -eps) per seed."""
    fitness: str = "zscore"
    """Fitness shaping: zscore (paper) or rank (centred ranks in [-0.5, 0.5])."""
    skip_centre_eval: bool = False
    """Do not score the centre on the support split after every iteration (it is for the metrics only)."""
    include: str = ".*"
    """Regex of parameter names to perturb."""
    exclude: str = ""
    """Regex of parameter names not to perturb."""

    def validate(self) -> "ESConfig":
        super().validate()
        if self.iterations < 1:
            raise CorpError(f"--iterations must be >= 1, got {self.iterations}")
        if self.population < 2:
            raise CorpError(f"--population must be >= 2, got {self.population}")
        if self.antithetic and self.population % 2:
            raise CorpError(f"--population must be even with --antithetic, got {self.population}")
        if not self.sigma > 0 or not self.alpha > 0:
            raise CorpError(f"--sigma and --alpha must be > 0, got sigma={self.sigma}, alpha={self.alpha}")
        if self.fitness not in ("zscore", "rank"):
            raise CorpError(f"--fitness '{self.fitness}' is unknown; choose zscore or rank")
        return self


def iteration_seeds(master_seed: int, iteration: int, n: int) -> list[int]:
    """n distinct seeds for iteration t, a function of (master seed, t) only."""
    seeds, i = [], 0
    while len(seeds) < n:
        d = hashlib.blake2b(f"corp-es|{int(master_seed)}|{int(iteration)}|{i}".encode(), digest_size=4).digest()
        s = int.from_bytes(d, "little") & 0x7FFFFFFF
        if s not in seeds:
            seeds.append(s)
        i += 1
    return seeds


def specialists(cfg: ESConfig, iteration: int) -> list[tuple[int, int]]:
    """(seed, sign) pairs of iteration t."""
    if cfg.antithetic:
        return [(s, sign) for s in iteration_seeds(cfg.seed, iteration, cfg.population // 2) for sign in (1, -1)]
    return [(s, 1) for s in iteration_seeds(cfg.seed, iteration, cfg.population)]


def fitness(rewards: np.ndarray, kind: str) -> np.ndarray:
    """z-scores (0 when all rewards are equal) or centred ranks in [-0.5, 0.5] (ties share their mean rank)."""
    r = np.asarray(rewards, dtype=np.float64)
    if kind == "zscore":
        sd = r.std()
        return (r - r.mean()) / sd if sd > 1e-12 else np.zeros_like(r)
    from scipy.stats import rankdata

    return (rankdata(r) - 1) / (len(r) - 1) - 0.5


def update_components(cfg: ESConfig, specs: list[tuple[int, int]], rewards: list[float]) -> list[Component]:
    """The centre update as seed components: coef = alpha f_i sign_i / (N sigma), merged per seed."""
    f = fitness(np.array(rewards), cfg.fitness)
    coefs: dict[int, float] = {}
    for (seed, sign), fi in zip(specs, f):
        coefs[seed] = coefs.get(seed, 0.0) + float(cfg.alpha * fi * sign / (len(specs) * cfg.sigma))
    return [Component(seed, cfg.sigma, c) for seed, c in coefs.items() if c != 0.0]


class Centre:
    """The fp32 master copy of the centre, installed as the backend Perturber's pristine base."""

    def __init__(self, perturber):
        self.perturber = perturber
        perturber.base = {n: b.to(torch.float32, copy=True) for n, b in perturber.base.items()}
        self._gen = torch.Generator(device="cpu")
        self._buf = torch.empty(max(b.numel() for b in perturber.base.values()), dtype=torch.float32)

    @torch.no_grad()
    def add(self, components: list[Component]) -> None:
        d = Direction(list(components))
        for name, base in self.perturber.base.items():
            d.add_to(base, name, self._gen, self._buf)


def run_es(cfg: ESConfig, backend=None) -> dict:
    from corp.models import save_model

    ctx = setup_run(cfg, "es", backend)
    base_hash = ctx.weights_hash  # of the base, before the centre moves
    model_id = getattr(ctx.backend, "model_id", cfg.model)
    perturber = getattr(ctx.backend, "perturber", None)
    if perturber is None:
        raise CorpError("corp es needs a backend with an in-process model; pass --backend hf")
    run_dir = ctx.run_dir
    state_path = run_dir / "es_state.json"
    pop_path = run_dir / "population.jsonl"
    check_meta(run_dir / "population_meta.json", population_meta(ctx, "support"), "population.jsonl")
    test_path = run_dir / "test_evals.jsonl"
    tests = {r["key"]: r for r in read_jsonl(test_path, key="key")}

    def test_row(key: str, direction_is_base: bool) -> dict:
        if key not in tests:
            res = evaluate(ctx, ctx.splits["test"], None) if direction_is_base else evaluate_current(ctx, ctx.splits["test"])
            tests[key] = result_row(None, None, "test", res, key=key)
            append_jsonl(test_path, tests[key])
        return tests[key]

    state = read_json(state_path) if state_path.exists() else {"iteration": 0, "components": [], "base_weights_hash": base_hash}
    if state.get("base_weights_hash") != base_hash:
        raise CorpError(f"'{state_path}' was made from other base weights; use another --run-dir")
    done_iters = int(state["iteration"])
    if done_iters == 0:
        test_row("base:test", True)  # while the centre is still the base
    centre = Centre(perturber)
    components = [Component(int(c["seed"]), float(c["sigma"]), float(c["coef"])) for c in state["components"]]
    centre.add(components)  # resume: same additions, same bits

    scored = {r["key"]: r for r in read_jsonl(pop_path, key="key")}
    metrics_path = run_dir / "metrics.jsonl"
    logged = {r["iteration"] for r in read_jsonl(metrics_path, key="iteration")}
    support = ctx.splits["support"]
    bar = tqdm(total=cfg.iterations, initial=done_iters, desc="es", unit="iter", dynamic_ncols=True, disable=os.environ.get("CORP_NO_PROGRESS") == "1")
    try:
        for t in range(done_iters, cfg.iterations):
            t0 = time.perf_counter()
            specs = specialists(cfg, t)
            rewards, rows = [], []
            for seed, sign in specs:
                key = f"it{t}:{seed}:{sign}"
                if key not in scored:
                    res = evaluate(ctx, support, Direction.single(seed, cfg.sigma, float(sign)))
                    scored[key] = result_row(seed, cfg.sigma, "support", res, key=key, iteration=t, sign=sign)
                    append_jsonl(pop_path, scored[key])
                rows.append(scored[key])
                rewards.append(scored[key]["reward"])
            new = update_components(cfg, specs, rewards)
            centre.add(new)
            components += new
            ctx.backend.set_direction(None)  # weights := the new centre
            row = {"iteration": t + 1, "reward_mean": float(np.mean(rewards)), "reward_max": float(np.max(rewards)), "reward_min": float(np.min(rewards)), "components": len(components)}
            led_tokens = {"prompt_tokens": sum(r["prompt_tokens"] for r in rows), "generated_tokens": sum(r["generated_tokens"] for r in rows)}
            if not cfg.skip_centre_eval:
                key = f"centre{t + 1}:support"
                if key not in scored:
                    res = evaluate_current(ctx, support)
                    scored[key] = result_row(None, None, "support", res, key=key, iteration=t + 1, centre=True)
                    append_jsonl(pop_path, scored[key])
                row["centre_reward"] = scored[key]["reward"]
            row["seconds"] = time.perf_counter() - t0
            row.update(led_tokens)
            write_json(state_path, {"iteration": t + 1, "components": Direction(components).to_json(), "base_weights_hash": base_hash})
            if t + 1 not in logged:
                append_jsonl(metrics_path, row)
            bar.set_postfix(reward=f"{row['reward_mean']:.3f}", centre=f"{row.get('centre_reward', float('nan')):.3f}")
            bar.update(1)
    finally:
        bar.close()

    ctx.backend.set_direction(None)  # the final centre
    n_done = int(read_json(state_path)["iteration"])
    final = test_row(f"centre{n_done}:test", False)  # keyed by iterations done, so a longer resumed run re-evaluates
    recipe = {
        "base_model": model_id,
        "base_weights_hash": base_hash,
        "noise_scheme": SCHEME_VERSION,
        "param_filter": {"include": cfg.include, "exclude": cfg.exclude},
        "components": Direction(components).to_json(),
        "made_by": {"method": "es", "iterations": cfg.iterations, "population": cfg.population, "sigma": cfg.sigma, "alpha": cfg.alpha, "antithetic": cfg.antithetic, "fitness": cfg.fitness},
    }
    write_json(run_dir / "recipe.json", recipe)
    save_model(ctx.backend.model, ctx.backend.tokenizer, run_dir / "model")
    sel = ctx.ledger()
    for r in read_jsonl(pop_path, key="key"):
        sel.add_generation(r["prompt_tokens"], r["generated_tokens"])
    base = tests["base:test"]
    report = {
        "method": "es",
        "model": cfg.model,
        "task": cfg.task,
        "run_dir": str(run_dir),
        "iterations": cfg.iterations,
        "n_test": len(ctx.splits["test"]),
        "test_accuracy_before": base["accuracy"],
        "test_accuracy_after": final["accuracy"],
        "training_ledger": sel.to_dict(),
        "flops_formula": FLOPS_FORMULA,
        "metrics": read_jsonl(metrics_path, key="iteration"),
        "recipe": str(run_dir / "recipe.json"),
        "model_dir": str(run_dir / "model"),
    }
    write_json(run_dir / "report.json", report)
    return report
