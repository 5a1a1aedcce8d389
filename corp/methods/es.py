"""ES: iterative OpenES in weight space on the population scorer.

Paper: Qiu et al., "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning"
(arXiv 2509.24372).

Each iteration t scores N specialists centre_t + sigma eps(seed_i) (or +- pairs with
`--antithetic`) on the support split, greedy, turns their mean rewards into fitness f (z-scored, or
centred ranks in [-0.5, 0.5]) and moves the centre by (alpha / N) sum_i f_i eps_i. An ES run is
therefore a list of seed components: the centre is base + Direction(components so far), each
component (seed_i, sigma, coef = alpha f_i / (N sigma)) contributes coef * sigma * eps = alpha f_i eps / N.
The centre is the backend's base, moved with `backend.move_base(components)`: an fp32 master
updated by adding components in order with `Direction.add_to`, the same floating-point operations
`Perturber.apply(Direction(all components))` performs on the base, in the engine and in corp's host
copy alike (vLLM's worker moves its own base the same way): the saved recipe materialises the final
model bit-exactly, and a resumed run rebuilds the centre from its checkpointed components.

Where we depart from the paper, and why:
- sigma is calibrated from the model by default (`--sigma auto`, issue 55): before iteration 1 the run
  measures the noise scale at which half of a few calibration specialists' greedy completions on the
  first 8 support prompts differ from the base's (corp.evaluate.calibration, the rule of the population
  methods' `--sigmas auto`) and uses that scale, sigma*, for every member. The paper's fixed 1e-3 does not
  fit every model (on a small one it leaves most members answering as the centre does). The calibration's
  generations are charged to the training ledger (so a matched-compute comparison includes them), its rows
  go to calibration.jsonl and its outcome to calibration.json, which a resumed run reuses; the sigma is in
  the run's definition (population_meta.json's `calibrated_sigma`, every component of the recipe), and the
  report and model card state it in one line (`noise_scales`). `--sigma 1e-3` fixes the paper's value.
- The step is alpha / N * sum f_i eps_i, as the paper's code does (1/sigma absorbed into alpha);
  docs/methods.md writes alpha / (N sigma). With the paper's alpha = 5e-4 and sigma = 1e-3, the
  1/sigma form would move every weight by ~0.1 per step.
- Antithetic pairs and centred-rank fitness are options (the paper uses plain sampling, z-scores).
- Defaults are CPU-sized (N = 8, 4 iterations, 64 support examples) instead of N = 30 and hundreds
  of iterations; the paper's scale is a matter of flags.
- The centre's own support reward is scored every iteration (`--skip-centre-eval` turns it off) for
  the metrics; it costs one more evaluation per iteration, counted in the ledger.
- By default every member is scored on the whole support split. `--prompts-per-iteration K` scores
  each iteration's members (and the centre) on K support examples drawn afresh per iteration, the
  same K for every member, as the paper's trainer draws a batch of prompts per iteration: with a
  large support split (the bench's equal-data setting, 144 examples) ES otherwise gets only a few
  iterations for its FLOPs.
- Noise (`--noise`): full-rank Gaussian eps (the paper's, the default) or low-rank (`--noise lowrank:r=R`,
  corp.algorithms.perturb.lowrank_noise, EGGROLL's E = A B^T / sqrt(R) per weight matrix, none on 1-D
  parameters): member i's noise is E_i, the update (alpha / N) sum_i f_i E_i has rank at most N R per
  matrix (fewer with --antithetic: N/2 seeds), and norms and biases never move. The scheme is in the
  run's definition (population_meta.json), in every row's key and in the recipe: a run is resumed
  only under the scheme it was made with. Specialists are materialised one at a time (the reference
  computation), not scored through the batched factored pass.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import ClassVar

import numpy as np

from corp.algorithms.perturb import Component, Direction, ParamFilter
from corp.algorithms.perturb.lowrank_noise import scheme_from_flag
from corp.algorithms.perturb.noise import derive_seeds
from corp.algorithms.recipe import make_recipe, produced_weights
from corp.algorithms.stats import zscore
from corp.config import RunConfig
from corp.errors import CorpError
from corp.evaluate.calibration import (
    calibration_flag,
    charge,
    is_auto,
    scale_line,
)
from corp.evaluate.scorer import noise_scales
from corp.grids import edge_lines
from corp.method import ITERATIVE, SMALL, BenchAdapter, Method, num, opt
from corp.runtime.backends.base import MODEL, PERTURBER
from corp.runtime.context import (
    POPULATION_FILE,
    EvalCache,
    cached_eval,
    direction_fingerprint,
    population_definition,
    run_evals,
)
from corp.runtime.loop import Outputs, Steps, drive, method_rows, run_steps
from corp.runtime.runs import read_json, write_json

NAME = "es"  # the command, the report's method and its trained row
# its recipe's kind (corp.algorithms.recipe) and its run definition's: values stored in files (a recipe,
# population_meta.json), kept whatever the command is named
KIND = "es"


@dataclass
class ESConfig(RunConfig):
    iterations: int = 4
    """Number of ES iterations (centre updates)."""
    population: int = 8
    """N: specialists scored per iteration (with --antithetic, N/2 seeds, each +-)."""
    sigma: float | str = "auto"
    """Noise scale of the specialists. auto: calibrated from the model before iteration 1 (corp.evaluate.calibration, the rule of `--sigmas auto`: the scale at which half of a few calibration specialists' greedy completions on 8 support prompts differ from the base's), its cost charged to the training ledger and stated in the report; a number fixes it (the paper's: 1e-3)."""
    alpha: float = 5e-4
    """Learning rate alpha: centre += alpha / N * sum_i f_i eps_i."""
    antithetic: bool = False
    """Use antithetic pairs (+eps, -eps) per seed."""
    fitness: str = "zscore"
    """Fitness shaping: zscore (paper) or rank (centred ranks in [-0.5, 0.5])."""
    skip_centre_eval: bool = False
    """Do not score the centre on the support split after every iteration (it is for the metrics only)."""
    prompts_per_iteration: int = 0
    """Support examples each iteration's members are scored on: 0 = the whole support split; K = K of them
    drawn without replacement per iteration from (seed, iteration), the same K for every member."""
    include: str = ".*"
    """Regex of parameter names to perturb."""
    exclude: str = ""
    """Regex of parameter names not to perturb."""
    noise: str = "full"
    """Noise scheme of the members: full (full-rank Gaussian) or lowrank:r=R (rank-R noise per weight matrix,
    E = A B^T / sqrt(R); 1-D parameters get none), so each update has rank <= population x R per matrix."""

    # alpha is a learning rate (TRL's name); `--population` is every command's total number of specialists
    options: ClassVar[dict[str, str]] = {"alpha": "learning_rate", "population": "population_per_iteration"}

    def validate(self) -> ESConfig:
        super().validate()

        scheme_from_flag(self.noise)  # a bad --noise is one line before any model loads
        if self.iterations < 1:
            raise CorpError(f"--iterations must be >= 1, got {self.iterations}")
        if self.population < 2:
            raise CorpError(f"--population-per-iteration must be >= 2, got {self.population}")
        if self.antithetic and self.population % 2:
            raise CorpError(f"--population-per-iteration must be even with --antithetic, got {self.population}")
        self._check_sigma()
        if not (is_auto(self.sigma) or 0 < self.sigma < math.inf) or not 0 < self.alpha < math.inf:
            raise CorpError(
                f"--sigma and --learning-rate must be > 0 and finite, got sigma={self.sigma}, learning rate={self.alpha}"
            )
        if self.prompts_per_iteration < 0:
            raise CorpError(
                f"--prompts-per-iteration must be >= 0 (0: the whole support split), got {self.prompts_per_iteration}"
            )
        if self.fitness not in ("zscore", "rank"):
            raise CorpError(f"--fitness '{self.fitness}' is unknown; choose zscore or rank")
        return self

    def _check_sigma(self) -> None:
        """--sigma: auto (calibrated from the model when the run starts) or a number (text from a flag)."""
        if not isinstance(self.sigma, str):
            return
        if is_auto(self.sigma):
            self.sigma = "auto"
            return
        try:
            self.sigma = float(self.sigma)
        except ValueError:
            raise CorpError(
                f"--sigma '{self.sigma}' is neither auto nor a number; expected auto or e.g. 1e-3"
            ) from None


def iteration_seeds(master_seed: int, iteration: int, n: int) -> list[int]:
    """n distinct seeds for iteration t, a function of (master seed, t) only (the shared derivation)."""
    return derive_seeds("corp-es", master_seed, iteration, n=n)


def specialists(cfg: ESConfig, iteration: int) -> list[tuple[int, int]]:
    """(seed, sign) pairs of iteration t."""
    if cfg.antithetic:
        return [(s, sign) for s in iteration_seeds(cfg.seed, iteration, cfg.population // 2) for sign in (1, -1)]
    return [(s, 1) for s in iteration_seeds(cfg.seed, iteration, cfg.population)]


def iteration_batch(cfg: ESConfig, support: list, iteration: int) -> list | None:
    """The support examples iteration t's members are scored on (in support order), or None for the
    whole split (--prompts-per-iteration 0, or at least the split's size)."""
    k = cfg.prompts_per_iteration
    if not k or k >= len(support):
        return None
    rng = np.random.default_rng(derive_seeds("corp-es-batch", cfg.seed, iteration, n=1)[0])
    return [support[i] for i in sorted(rng.choice(len(support), size=k, replace=False))]


def fitness(rewards: np.ndarray, kind: str) -> np.ndarray:
    """z-scores (corp.algorithms.stats.zscore: 0 when all rewards are equal) or centred ranks in [-0.5, 0.5] (ties share their mean rank)."""
    r = np.asarray(rewards, dtype=np.float64)
    if kind == "zscore":
        return zscore(r)
    from scipy.stats import rankdata

    return (rankdata(r) - 1) / (len(r) - 1) - 0.5


def update_components(cfg: ESConfig, specs: list[tuple[int, int]], rewards: list[float]) -> list[Component]:
    """The centre update as seed components: coef = alpha f_i sign_i / (N sigma), merged per seed."""
    f = fitness(np.array(rewards), cfg.fitness)
    coefs: dict[int, float] = {}
    for (seed, sign), fi in zip(specs, f):
        coefs[seed] = coefs.get(seed, 0.0) + float(cfg.alpha * fi * sign / (len(specs) * cfg.sigma))
    return [Component(seed, cfg.sigma, c) for seed, c in coefs.items() if c != 0.0]


def es_definition(cfg: ESConfig, task, splits, max_new_tokens: int) -> dict:
    """What defines an ES run's rows (kind "es": noise around a moving centre, never a population of
    perturbations of the base, so `--from-run` refuses it). --iterations may grow on resume. `sigma` is as
    given ("auto" or the number): the sigma a calibration chose is added as `calibrated_sigma` (corp.evaluate.scorer.noise_scales)."""
    return population_definition(
        cfg,
        task,
        splits,
        max_new_tokens,
        kind=KIND,
        sigma=cfg.sigma,
        alpha=cfg.alpha,
        population=cfg.population,
        antithetic=cfg.antithetic,
        fitness=cfg.fitness,
        # only when set, so the runs made before the option keep their definition
        **({"prompts_per_iteration": cfg.prompts_per_iteration} if cfg.prompts_per_iteration else {}),
    )


def run_es(cfg: ESConfig, backend=None) -> dict:
    defines = partial(es_definition, cfg)  # of the task, splits and max_new_tokens
    return drive(cfg, NAME, backend, lambda ctx: _run_es(cfg, ctx), defines=defines)


class ESSteps(Steps):
    """ES's loop for the shared driver: the state is the centre's seed components (`es_state.json`);
    a step scores the iteration's specialists around the centre and moves it."""

    desc, unit, key = NAME, "iter", "iteration"

    def __init__(self, cfg: ESConfig, ctx, scored: EvalCache, base_hash: str):
        self.cfg, self.ctx, self.scored, self.base_hash = cfg, ctx, scored, base_hash
        self.state_path = ctx.run_dir / "es_state.json"
        self.metrics_path = ctx.run_dir / "metrics.jsonl"
        self.total = cfg.iterations
        self.components: list[Component] = []
        self.done = 0

    def resume(self) -> int:
        state = (
            read_json(self.state_path)
            if self.state_path.exists()
            else {"iteration": 0, "components": [], "base_weights_hash": self.base_hash}
        )
        if state.get("base_weights_hash") != self.base_hash:
            raise CorpError(f"'{self.state_path}' was made from other base weights; use another --output-dir")
        self.done = int(state["iteration"])
        self.components = [Component(int(c["seed"]), float(c["sigma"]), float(c["coef"])) for c in state["components"]]
        self.ctx.backend.move_base(self.components)  # the centre (resume: same additions, same bits)
        return self.done

    def step(self, t: int) -> dict:
        cfg, ctx = self.cfg, self.ctx
        t0 = time.perf_counter()
        specs = specialists(cfg, t)
        batch = iteration_batch(cfg, ctx.splits["support"], t)  # None: the whole support split
        drawn = {"example_ids": [e.id for e in batch]} if batch is not None else {}  # which ones, in the row
        centre_fp = direction_fingerprint(Direction(self.components))
        rewards, rows = [], []
        for seed, sign in specs:
            # a specialist is centre + sign * sigma * eps(seed): keyed by the centre's components, not by t
            what = f"es-specialist|centre={centre_fp}|seed={seed}|sign={sign}|sigma={float(cfg.sigma)!r}"
            r = cached_eval(
                ctx,
                self.scored,
                "support",
                Direction.single(seed, cfg.sigma, float(sign)),
                what=what,
                examples=batch,
                kind="es-specialist",
                **drawn,
                seed=seed,
                sigma=cfg.sigma,
                iteration=t,
                sign=sign,
            )
            rows.append(r)
            rewards.append(r["reward"])
        new = update_components(cfg, specs, rewards)
        ctx.backend.move_base(new)
        self.components += new
        self.done = t + 1
        ctx.backend.set_direction(None)  # weights := the new centre
        row = {
            "iteration": t + 1,
            "reward_mean": float(np.mean(rewards)),
            "reward_max": float(np.max(rewards)),
            "reward_min": float(np.min(rewards)),
            "components": len(self.components),
        }
        if not cfg.skip_centre_eval:
            c = cached_eval(
                ctx,
                self.scored,
                "support",
                what=f"es-centre|{direction_fingerprint(Direction(self.components))}",
                current=True,
                examples=batch,
                kind="es-centre",
                **drawn,
                iteration=t + 1,
            )
            row["centre_reward"] = c["reward"]
        row["seconds"] = time.perf_counter() - t0
        row["prompt_tokens"] = sum(r["prompt_tokens"] for r in rows)
        row["generated_tokens"] = sum(r["generated_tokens"] for r in rows)
        return row

    def save(self) -> None:
        write_json(
            self.state_path,
            {
                "iteration": self.done,
                "components": Direction(self.components).to_json(),
                "base_weights_hash": self.base_hash,
            },
        )

    def postfix(self, row: dict) -> dict:
        return {"reward": f"{row['reward_mean']:.3f}", "centre": f"{row.get('centre_reward', float('nan')):.3f}"}


def _run_es(cfg: ESConfig, ctx) -> Outputs:
    base_hash = ctx.weights_hash  # of the base, before the centre moves
    ctx.backend.require(PERTURBER, "corp es (its centre moves the base)")
    ctx.backend.require(MODEL, "corp es (it saves the final model)")
    perturber = ctx.backend.perturber
    if perturber.scheme != ctx.noise_scheme:  # an injected backend built for other noise: its rows would be mislabelled
        raise CorpError(
            f"--noise {cfg.noise} is scheme {ctx.noise_scheme}, but the backend materialises {perturber.scheme}; "
            f"build it with scheme={ctx.noise_scheme}"
        )
    run_dir = ctx.run_dir
    sigma, cal = noise_scales(ctx, "sigma")  # before iteration 1: calibrated under --sigma auto
    ctx.backend.set_direction(None)  # the centre again, not the last calibration specialist
    cfg = dataclasses.replace(cfg, sigma=sigma)  # what every member and update uses (ctx.cfg keeps "auto")
    evals = run_evals(ctx)
    base_test = cached_eval(ctx, evals, "test", None)  # the base, before the centre moves (cached on resume)

    scored = EvalCache(run_dir / POPULATION_FILE)
    loop = ESSteps(cfg, ctx, scored, base_hash)
    metrics = run_steps(ctx, loop)
    centre = Direction(loop.components)
    ctx.backend.set_direction(None)  # the final centre
    # keyed by the centre's components, so a longer resumed run re-evaluates
    final = cached_eval(
        ctx, evals, "test", what=f"es-centre|{direction_fingerprint(centre)}", current=True, kind="es-centre"
    )
    # the shared recipe writer: kind es, base named as the user gave it (an alias works offline) and as resolved
    made_by = {
        "method": NAME,
        "iterations": cfg.iterations,
        "population": cfg.population,
        "sigma": cfg.sigma,
        "alpha": cfg.alpha,
        "antithetic": cfg.antithetic,
        "fitness": cfg.fitness,
    }
    pf = ParamFilter(cfg.include, cfg.exclude)
    produced = produced_weights(ctx.backend.model)
    recipe = make_recipe(
        cfg.model, ctx.model_id, base_hash, pf, centre, made_by, kind=KIND, scheme=perturber.scheme, produced=produced
    )
    sel = ctx.ledger().add_rows(scored.rows.values())
    if cal:  # the calibration that chose sigma is part of what training cost
        charge(sel, cal)
    ids = ctx.example_ids("test")
    held = loop.done  # what the centre holds (a run trained further than asked says so), as saved
    n_support = len(ctx.splits["support"])
    rows = method_rows(ctx.backend.n_params, NAME, base_test, final, n_support, ids, {"iterations": held})
    fields = {
        "iterations": held,
        "sigma": sigma,
        "noise_scales": scale_line(sigma, cal),
        **({"calibration": cal} if cal else {}),
        "test_accuracy_before": base_test["accuracy"],
        "test_accuracy_after": final["accuracy"],
        "metrics": metrics,
    }
    flagged = calibration_flag(cal, "sigma")  # a calibration that never bracketed its target used a bound
    if flagged:
        fields["edge_flags"] = [flagged]
    return Outputs(
        rows,
        [(NAME, "base")],
        ids,
        fields,
        ledger=sel,
        model=(ctx.backend.model, ctx.backend.tokenizer),
        recipe=recipe,
        notes=lambda report: [
            f"ES training ({'noise-scale calibration, ' if cal else ''}population and centre evaluations on the "
            f"support split): {sel.flops:.3e} FLOPs",
            report["noise_scales"],
            *edge_lines(report.get("edge_flags")),
        ],
    )


def summary(report: dict) -> str:
    lines = [
        f"iteration {m['iteration']}: population reward {num(m.get('reward_mean'))} (max "
        f"{num(m.get('reward_max'))}), centre {num(m.get('centre_reward'))}"
        for m in report.get("metrics") or []
    ]
    led = report.get("training_ledger") or {}
    if report.get("table"):
        lines.append(report["table"])
    measure, before, after = _test_measure(report)
    lines.append(
        f"test {measure}: base {num(before)} -> {NAME} {num(after)}  (training {num(led.get('flops'), '.3e')} FLOPs)"
    )
    lines.append(f"run directory: {report.get('run_dir')}")
    return "\n".join(lines)


def _test_measure(report: dict) -> tuple[str, float | None, float | None]:
    """(what the test rows measure, the base's, the centre's): the reward where the data has no gold answers."""
    if report.get("measure") != "reward":
        return "accuracy", report.get("test_accuracy_before"), report.get("test_accuracy_after")
    rewards = {r["method"]: r.get("reward") for r in report.get("rows") or []}
    return "reward", rewards.get("base"), rewards.get(NAME)


def _support_share(o: dict) -> float:
    """The share of a support pass one ES evaluation costs: prompts_per_iteration of n_support (0: all)."""
    k, n = int(opt(o, ESConfig, "prompts_per_iteration")), max(1, int(opt(o, ESConfig, "n_support")))
    return min(k, n) / n if k else 1.0


def _touched(o: dict, seed: int, units: int | None) -> int | None:
    """ES scores every member on its iteration's batch (iteration_batch) or the whole support."""
    n = int(o.get("n_support") or 0)
    k = int(opt(o, ESConfig, "prompts_per_iteration"))
    if not k or k >= n or units is None:
        return n
    support = list(range(n))
    c = SimpleNamespace(prompts_per_iteration=k, seed=seed)
    return len({i for t in range(units) for i in iteration_batch(c, support, t)})


METHOD = Method(
    NAME,
    ESConfig,
    run_es,
    "ES: iterative OpenES around a moving centre; saves the model and its seed recipe, reports test accuracy.",
    recipes=(KIND,),
    model=True,
    smoke={**SMALL, "iterations": 2, "population": 4, "sigma": 0.05, "alpha": 0.05},
    summary=summary,
    # one ES iteration scores `population` specialists and (unless skipped) the centre, each on
    # prompts_per_iteration support examples (0: all of them)
    bench=BenchAdapter(
        ITERATIVE,
        NAME,  # the trained row
        flops=("training_ledger.flops",),
        equal_data=True,
        unit="iterations",
        units_done="iterations",
        unit_evals=lambda o: (
            (float(opt(o, ESConfig, "population")) + (0.0 if opt(o, ESConfig, "skip_centre_eval") else 1.0))
            * _support_share(o)
        ),
        touched=_touched,
        # issue 39: a population and iteration count in its paper's range (30 members, hundreds of
        # iterations; 100 is the floor taken here)
        regime={"population": 30, "units": 100},
        reached=lambda got: f"population {got.get('population', '?')} x {got['units']:.3g} iterations",
    ),
)
