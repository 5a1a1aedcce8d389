"""How the total cost of a CoRP run grows with the population size N (issue 16, last target).

Measured, on a tiny random Llama (2 layers, hidden 64, character tokenizer, built here), for each N
in --populations: the phases of `corp consolidate` and `corp analyze-rank --from-run`, run through
their own entry points (`run_consolidate`, `run_analyze_rank`) with timers wrapped around the
functions they call:
  population scoring   corp.evaluate.scorer.ensure_population (every specialist on the support split)
  Gram                 corp.algorithms.corp_operator.algebra.perturbation_grams (exact weight-space Gram over the
                       widest elite set, the default --compat exact)
  step search          corp.algorithms.corp_operator.stage1.merge_and_search minus the Gram inside it:
                       building the merged directions (keep_together) + one probe evaluation per
                       candidate (apply + generate)
  gates                the rest of consolidate_stage1: validation gates and the base's probe score
  analysis             corp.methods.analyze_rank.rank_stats.analyze_population (split-half, S splits x P permutations)
  power                corp.methods.analyze_rank.power.analysis_power (analyze-rank's default power simulation)
Every figure is CPU seconds of this process (time.process_time, one torch thread, OMP_NUM_THREADS=1):
the machine this was written on is shared, so wall seconds (also recorded) are not comparable
between runs. Rewards come from `digit_share` below (share of digits in the completion), so a
random model gives distinct rewards and the elite set is about (1 - q) N, as on a real task.

With --anchor, the embedded SmolLM2-135M is measured on a handful of cases to give per-unit costs
at its size (all through corp's functions, one thread): scoring of a few specialists on the support
split and one probe evaluation; the exact Gram matrix (gram_matrix) over layer 0's tensors at two
seed counts (noise per element and fp64 product per element-pair); building one and then two merged
directions from a few elites and applying one (keep_together, set_direction: noise per elite and
accumulation per direction); the split-half analysis of layer 0 at two N, and per matrix the
marginal cost per specialist of forming its aggregates with the noise stacked or streamed
(NoiseStack). `extrapolate()` then gives each phase at N = 500 and 5000 for the embedded model from
those rates and the growth laws that the tiny rows show (stated in the output), replaying the Gram's
memory blocking on the real shapes and the analysis's stacked/streamed choice per matrix.
Results and how they were run: results/cost-growth/README.md.

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/cost_growth.py --populations 32,128,512 --anchor --out results/cost-growth
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: one thread, CPU time = work
os.environ.setdefault("CORP_NO_PROGRESS", "1")

import argparse
import functools
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def digit_share(completion: str, answer, **_) -> float:
    """Benchmark reward: the share of digits among the completion's characters (0 for an empty one).
    A random model almost never answers `arith` right; this spreads the rewards so that elite sets
    have their usual size (about (1 - q) N) instead of ties making every specialist an elite."""
    return sum(c.isdigit() for c in completion) / len(completion) if completion else 0.0


class Clock:
    """CPU and wall seconds per phase, summed over calls; `wrap` times a function in place."""

    def __init__(self):
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.samples: dict[str, list[float]] = {}

    def add(self, name: str, cpu: float, wall: float) -> None:
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.calls[name] = self.calls.get(name, 0) + 1
        self.samples.setdefault(name, []).append(cpu)

    def wrap(self, module, attr: str, name=None):
        real = getattr(module, attr)

        @functools.wraps(real)
        def timed(*a, **k):
            c0, t0 = time.process_time(), time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                self.add(
                    name(*a, **k) if callable(name) else (name or attr),
                    time.process_time() - c0,
                    time.perf_counter() - t0,
                )

        setattr(module, attr, timed)
        return real


def tiny_model_dir() -> tuple[str, int]:
    sys.path.insert(0, str(REPO))
    from tests.conftest import make_char_tokenizer, make_tiny_llama

    d = Path(tempfile.mkdtemp(prefix="corp-cost-growth-model-"))
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok, hidden=64)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d), sum(p.numel() for p in model.parameters())


def measure_n(model_dir: str, n: int, args) -> dict:
    """One `corp consolidate` + `corp analyze-rank --from-run` on the tiny model, phases timed."""
    import corp.methods.analyze_rank.split_half as split_half
    import corp.algorithms.corp_operator.stage1 as op
    import corp.methods.consolidate.run as crun
    from corp.methods.analyze_rank.config import AnalyzeRankConfig
    from corp.config import load_config
    from corp.methods.consolidate.config import ConsolidateConfig

    clock = Clock()
    restore = []
    for mod, attr, name in (
        (crun, "ensure_population", "scoring"),
        (op, "perturbation_grams", "gram"),
        (op, "merge_and_search", "merge_and_search"),
        (op, "keep_together", "build"),
        (crun, "consolidate_stage1", "stage1_total"),
        (split_half, "analyze_population", "analysis"),
        (split_half, "analysis_power", "power"),
    ):
        restore.append((mod, attr, clock.wrap(mod, attr, name)))
    # every evaluation CoRP asks for goes through RunScorer.__call__; name it by its split
    restore.append(
        (crun.RunScorer, "__call__", clock.wrap(crun.RunScorer, "__call__", lambda self, d, split: f"eval:{split}"))
    )
    run_dir = Path(tempfile.mkdtemp(prefix=f"corp-cost-growth-N{n}-")) / "run"
    over = {
        "model": model_dir,
        "task": "arith",
        "reward": f"{Path(__file__).resolve()}:digit_share",
        "population": n,
        "seed": 0,
        "n_support": args.n_support,
        "n_probe": args.n_probe,
        "n_validation": args.n_validation,
        "n_test": args.n_test,
        "top_k": "1",
        "threads": 1,
        "run_dir": str(run_dir),
    }
    if args.preset:
        over["preset"] = args.preset
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        report = crun.run_consolidate(load_config(ConsolidateConfig, None, over))
        consolidate_cpu, consolidate_wall = time.process_time() - c0, time.perf_counter() - t0
        c0, t0 = time.process_time(), time.perf_counter()
        acfg = load_config(
            AnalyzeRankConfig,
            None,
            {
                "from_run": str(run_dir),
                "threads": 1,
                "power_sims": args.power_sims,
                "skip_power": args.power_sims == 0,
                "splits": args.splits,
                "permutations": args.permutations,
            },
        )
        split_half.run_analyze_rank(acfg)
        analyze_cpu, analyze_wall = time.process_time() - c0, time.perf_counter() - t0
    finally:
        for mod, attr, real in restore:
            setattr(mod, attr, real)
    pop = [json.loads(x) for x in (run_dir / "population.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in pop if r.get("kind") == "specialist"]
    stage1 = report["corp"]["stage1"]
    elites = max(len(st["elite"]) for st in stage1)  # the widest elite set: the Gram's size
    cpu, wall = clock.cpu, clock.wall
    candidates = clock.calls.get("eval:probe", 0) - 1  # the probe table's base row is one more probe evaluation
    step_cpu = cpu["merge_and_search"] - cpu.get("gram", 0.0)
    gen_samples = clock.samples.get("eval:probe", [])
    out = {
        "N": n,
        "specialists_scored": len(rows),
        "elites_widest": elites,
        "candidates": candidates,
        "scoring_cpu_s": cpu["scoring"],
        "scoring_per_specialist_cpu_s": cpu["scoring"] / n,
        "scoring_row_seconds_median": statistics.median(r["seconds"] + r.get("apply_seconds", 0.0) for r in rows),
        "gram_cpu_s": cpu.get("gram", 0.0),
        "step_search_cpu_s": step_cpu,
        "step_search_per_candidate_cpu_s": step_cpu / max(1, candidates),
        "build_cpu_s": cpu.get("build", 0.0),
        "probe_eval_cpu_s_median": statistics.median(gen_samples) if gen_samples else None,
        "gates_cpu_s": cpu["stage1_total"] - cpu["merge_and_search"],
        "consolidate_other_cpu_s": consolidate_cpu
        - cpu["scoring"]
        - cpu["stage1_total"],  # test rows, recipe, model save, set-up
        "consolidate_total_cpu_s": consolidate_cpu,
        "consolidate_total_wall_s": consolidate_wall,
        "analysis_cpu_s": cpu.get("analysis", 0.0),
        "power_cpu_s": cpu.get("power", 0.0),
        "analyze_rank_total_cpu_s": analyze_cpu,
        "analyze_rank_total_wall_s": analyze_wall,
        "wall_s": {k: round(v, 3) for k, v in wall.items()},
        "calls": dict(clock.calls),
    }
    print(json.dumps({k: v for k, v in out.items() if k not in ("wall_s", "calls")}), flush=True)
    return out


def fit(xs, ys, basis) -> dict:
    """Least squares y ~ sum_k c_k f_k(x) over the named basis functions; coefficients and max relative residual."""
    A = np.array([[f(x) for f in basis.values()] for x in xs], dtype=float)
    y = np.array(ys, dtype=float)
    c, *_ = np.linalg.lstsq(A, y, rcond=None)
    pred = A @ c
    return {
        "terms": dict(zip(basis, map(float, c))),
        "max_rel_residual": float(np.max(np.abs(pred - y) / np.maximum(np.abs(y), 1e-12))),
    }


def fits(runs: list[dict]) -> dict:
    N = [r["N"] for r in runs]
    E = [r["elites_widest"] for r in runs]
    return {
        "scoring ~ a N": fit(N, [r["scoring_cpu_s"] for r in runs], {"N": lambda x: x}),
        "gram ~ a E + b E^2": fit(E, [r["gram_cpu_s"] for r in runs], {"E": lambda x: x, "E^2": lambda x: x * x}),
        "step search ~ c + a E": fit(E, [r["step_search_cpu_s"] for r in runs], {"1": lambda x: 1.0, "E": lambda x: x}),
        "analysis ~ c + a N": fit(N, [r["analysis_cpu_s"] for r in runs], {"1": lambda x: 1.0, "N": lambda x: x}),
        "power ~ c + a N": fit(N, [r["power_cpu_s"] for r in runs], {"1": lambda x: 1.0, "N": lambda x: x}),
    }


def anchor(args) -> dict:
    """Per-unit costs on the embedded model (one thread), each through the function corp runs."""
    import torch

    from corp.methods.analyze_rank.rank_stats import analyze_population
    from corp.config import PopulationConfig, load_config
    from corp.algorithms.corp_operator.algebra import gram_matrix, perturbation_grams
    from corp.algorithms.corp_operator.stage1 import keep_together, stage1
    from corp.runtime.context import EvalCache, evaluate_current, setup_run
    from corp.evaluate.scorer import score_specialists, specialists_for
    from corp.algorithms.perturb import Direction

    torch.set_num_threads(1)
    out: dict = {"model": args.anchor_model}
    run_dir = Path(tempfile.mkdtemp(prefix="corp-cost-growth-anchor-")) / "run"
    cfg = load_config(
        PopulationConfig,
        None,
        {
            "model": args.anchor_model,
            "task": "arith",
            "population": args.anchor_specialists,
            "n_support": args.n_support,
            "n_probe": args.n_probe,
            "n_validation": 0,
            "n_test": 0,
            "threads": 1,
            "sigmas": "5e-4,1e-3,2e-3",  # the grid its results were measured on (corp's default is now auto)
            "run_dir": str(run_dir),
        },
    )
    c0 = time.process_time()
    ctx = setup_run(cfg, "bench", needs=("support", "probe"))
    backend = ctx.backend
    out["load_cpu_s"] = time.process_time() - c0
    perturber = backend.perturber
    params = [(n, p.shape) for n, p in perturber.params]
    out["n_params"] = int(perturber.n_selected)
    out["gram_shapes"] = [(n, list(s)) for n, s in params]  # the tensors the Gram and the build run over
    cache = EvalCache(run_dir / "anchor.jsonl")
    per = []
    for spec in specialists_for(cfg):  # one at a time, so each specialist's CPU time is its own
        c0, t0 = time.process_time(), time.perf_counter()
        score_specialists(ctx, [spec], "support", cache)
        per.append((time.process_time() - c0, time.perf_counter() - t0))
        print(json.dumps({"anchor": "specialist", "cpu_s": per[-1][0], "wall_s": per[-1][1]}), flush=True)
    out["specialist_cpu_s"] = [c for c, _ in per]
    out["specialist_wall_s"] = [w for _, w in per]
    c0, t0 = time.process_time(), time.perf_counter()
    evaluate_current(ctx, ctx.splits["probe"])
    out["probe_eval_cpu_s"], out["probe_eval_wall_s"] = time.process_time() - c0, time.perf_counter() - t0
    print(json.dumps({"anchor": "probe eval", "cpu_s": out["probe_eval_cpu_s"]}), flush=True)

    # exact Gram (gram_matrix) on layer 0's tensors at two seed counts, one memory block each:
    # cpu = k n t_noise + k^2 n t_pair (n elements); large k, so the fp64 products run as they would at E = 250
    layer0 = [(nm, sh) for nm, sh in params if ".layers.0." in nm]
    n0 = sum(int(np.prod(sh)) for _, sh in layer0)
    gram = {}
    for k in args.anchor_gram_k:
        c0 = time.process_time()
        gram_matrix(layer0, list(range(1000, 1000 + k)), args.gram_memory_gb, progress=False)
        gram[k] = time.process_time() - c0
        print(json.dumps({"anchor": "gram layer 0", "k": k, "elements": n0, "cpu_s": gram[k]}), flush=True)
    (k1, g1), (k2, g2) = sorted(gram.items())[:2]
    t_pair = (g2 / k2 - g1 / k1) / (k2 - k1) / n0
    t_noise = (g1 / k1 - k1 * t_pair * n0) / n0
    out["gram_cpu_s"], out["gram_elements"] = gram, n0
    out["gram_t_noise_per_element"], out["gram_t_pair_per_element"] = t_noise, t_pair

    # build merged directions from E elites (keep_together: D = 1, then D = 2 together) and apply one:
    # the step search's non-generation part, build = E (t_noise + D t_accumulate)
    n_pop = 2 * args.anchor_elites
    seeds = list(range(2000, 2000 + n_pop))
    sigmas = [(5e-4, 1e-3, 2e-3)[i % 3] for i in range(n_pop)]
    perts = [Direction.single(s, sg) for s, sg in zip(seeds, sigmas)]
    _, G_apx = perturbation_grams(perts, params, None, 2.0, False)
    st = stage1(np.random.default_rng(0).random(n_pop), 0.5, 10.0, None, G_apx, ["pass2", "pass1"])
    builds = {}
    for rules in (["pass2"], ["pass2", "pass1"]):
        c0 = time.process_time()
        keep_together(perturber, [st.direction(perts, r) for r in rules])
        builds[len(rules)] = time.process_time() - c0
        if len(rules) == 2:
            c0 = time.process_time()
            backend.set_direction(st.direction(perts, "pass2").scaled(2.0))
            out["apply_cpu_s"] = time.process_time() - c0
            backend.set_direction(None)
        perturber.release_merged()
    E = len(st.elite)
    out["build_cpu_s"], out["build_elites"] = builds, E
    out["build_t_accumulate"] = (builds[2] - builds[1]) / E  # per elite and direction, one full-model pass
    out["build_t_noise"] = builds[1] / E - out["build_t_accumulate"]  # per elite, one full-model pass
    print(json.dumps({"anchor": "build", "elites": E, "cpu_s": builds, "apply_cpu_s": out["apply_cpu_s"]}), flush=True)
    ctx.close()
    del ctx, backend, perturber

    # split-half analysis of layer 0 at two N (analyze_population), and per matrix the cost per
    # specialist of forming the aggregates with the noise stacked (N numel 4 <= --memory-mb) or
    # streamed (above it: one rank-1 update per specialist), both through NoiseStack
    from corp.methods.analyze_rank.rank_stats import NoiseStack, Plan, analysis_targets
    from corp.methods.analyze_rank.split_half import model_shapes

    _, named, vocab = model_shapes(args.anchor_model)
    targets, _ = analysis_targets(named, vocab, False, r"layers\.0\.")
    ana = {}
    for n in args.anchor_analysis_n:
        c0 = time.process_time()
        analyze_population(
            named,
            list(range(n)),
            [(5e-4, 1e-3, 2e-3)[i % 3] for i in range(n)],
            np.random.default_rng(n).random(n),
            splits=args.splits,
            permutations=args.permutations,
            vocab_size=vocab,
            matrices=r"layers\.0\.",
            progress=False,
            threads=1,
        )
        ana[n] = time.process_time() - c0
        print(json.dumps({"anchor": "analysis layer 0", "N": n, "matrices": len(targets), "cpu_s": ana[n]}), flush=True)
    # marginal cost per specialist: combine at two population sizes (the (231 x numel) output and
    # the plan are paid once whatever N is), difference / difference in k
    ks = (4, 12)
    per_matrix = []
    for name, shape in targets:
        rates = {}
        for mode, budget in (("stacked", 1 << 40), ("streamed", 0)):
            cost = []
            for k in ks:
                plan = Plan.make(np.random.default_rng(0).random(k), args.splits, args.permutations, 0)
                C = torch.cat(
                    [plan.group_rows(g) for g in range(len(plan.perms))]
                )  # every group's rows, as analyze_matrix combines them
                c0 = time.process_time()
                NoiseStack(name, shape, list(range(k)), [1e-3] * k, budget).combine(C)
                cost.append(time.process_time() - c0)
            rates[mode] = (cost[1] - cost[0]) / (ks[1] - ks[0])
        per_matrix.append(
            {"name": name, "shape": list(shape), **{f"{m}_per_specialist_cpu_s": v for m, v in rates.items()}}
        )
    layers = sorted({int(nm.split(".layers.")[1].split(".")[0]) for nm, _ in named if ".layers." in nm})
    out["analysis_layer0_cpu_s"], out["analysis_per_matrix"], out["layers"] = ana, per_matrix, len(layers)
    out["analysis_memory_mb"] = 1024
    return out


def gram_model_cost(shapes, k: int, memory_gb: float, t_noise: float, t_pair: float) -> tuple[float, float]:
    """CPU seconds of gram_matrix for k seeds: each seed's noise of each tensor (n elements) is drawn once, in
    column pieces (corp_operator.algebra._tensor_gram), and each piece's k x k product covers k^2 n
    element-pairs (the memory budget sets the pieces' width, not the work)."""
    noise_el = pair_el = 0.0
    for shape in shapes:
        n = int(np.prod(shape))
        noise_el += k * n
        pair_el += k * k * n
    return noise_el * t_noise, pair_el * t_pair  # (noise generation and fp64 conversion, products)


def extrapolate(runs: list[dict], anc: dict | None, tiny_params: int, args) -> dict:
    """Each phase for the embedded model at N = 500 and 5000 (corp's default split sizes unless given),
    from the anchor's measured rates and the growth laws fitted on the tiny rows."""
    from corp.algorithms.corp_operator.config import PAPER_PRESET

    out = {"assumptions": [], "cases": []}
    if anc is None:
        return out
    P = anc["n_params"]
    q = 0.5  # the widest elite set of both grids: E = (1 - q) N
    spec = statistics.median(anc["specialist_cpu_s"])
    probe = anc["probe_eval_cpu_s"]
    val = probe * args.n_validation / args.n_probe  # same prompts' length and generation budget, twice as many
    t_noise_full, t_acc = anc["build_t_noise"], anc["build_t_accumulate"]
    # analysis per layer = const + sum over matrices of N x (stacked or streamed rate, by whether the
    # matrix's N-specialist noise fits --memory-mb); const from the smaller measured N
    budget = anc["analysis_memory_mb"] << 20

    def layer_rate(N: int) -> float:
        return sum(
            m["stacked_per_specialist_cpu_s"]
            if N * int(np.prod(m["shape"])) * 4 <= budget
            else m["streamed_per_specialist_cpu_s"]
            for m in anc["analysis_per_matrix"]
        )

    measured = sorted((int(k), v) for k, v in anc["analysis_layer0_cpu_s"].items())
    (na, ca) = measured[0]
    ana_const = ca - na * layer_rate(na)
    out["analysis_check"] = [
        {"N": n, "measured_cpu_s": c, "model_cpu_s": ana_const + n * layer_rate(n)} for n, c in measured
    ]
    shapes = [s for _, s in anc["gram_shapes"]]
    grids = {
        "cpu-default": dict(quantiles=[0.5], betas=[10.0], alphas=[1.0, 2.0, 4.0, 8.0]),
        "paper": {k: list(v) for k, v in PAPER_PRESET.items()},
    }
    out["assumptions"] = [
        f"embedded model: {P:,} perturbed parameters; support {args.n_support}, probe {args.n_probe}, validation "
        f"{args.n_validation} examples (corp's defaults); one thread",
        f"scoring = N x {spec:.2f} CPU s (median of {len(anc['specialist_cpu_s'])} measured specialists on the "
        "support split): linear in N (tiny rows: fit 'scoring ~ a N')",
        "Gram (exact compat) over E = (1 - q) N = N/2 elites: gram_matrix's blocking replayed on the model's "
        f"{len(shapes)} tensors at --gram-memory-gb {args.gram_memory_gb}, noise "
        f"{anc['gram_t_noise_per_element']:.3e} s per element, fp64 product {anc['gram_t_pair_per_element']:.3e} s "
        f"per element-pair (both measured at k = {sorted(anc['gram_cpu_s'])})",
        f"step search = candidates x (probe eval {probe:.2f} s + apply {anc['apply_cpu_s']:.2f} "
        f"s) + build; build = groups x E x {t_noise_full:.3f} s (noise, once per group of "
        f"directions that fit --merge-memory-gb 4) + directions x E x {t_acc:.3f} s (accumulate), "
        f"both measured by building 1 and 2 directions over {anc['build_elites']} elites",
        f"gates = 2 rules x validation eval ({val:.2f} s, probe eval scaled by "
        f"{args.n_validation}/{args.n_probe}) + base on validation + base on probe",
        f"analysis = {anc['layers']} layers x (const {ana_const:.1f} s + N x per-specialist aggregate cost, "
        f"{layer_rate(16):.3f} s per layer with every matrix's noise stacked, {layer_rate(10**6):.3f} s streamed, "
        f"per matrix by whether N x its size x 4 bytes fits --memory-mb {anc['analysis_memory_mb']}); layer 0 "
        f"measured at N = {[n for n, _ in measured]} (model vs measured: "
        f"{[(c['N'], round(c['model_cpu_s'], 1), round(c['measured_cpu_s'], 1)) for c in out['analysis_check']]}); "
        f"S = {args.splits}, P = {args.permutations}; embeddings excluded (the default); the power simulation is "
        "not included",
    ]
    for gname, g in grids.items():
        rules = 2
        directions = rules * len(g["quantiles"]) * len(g["betas"])
        cands = directions * len(g["alphas"])
        group = max(1, int(4.0 * 2**30 // (4 * P)))
        groups = math.ceil(directions / group)
        for N in (500, 5000):
            E = int(round((1 - q) * N))
            build = groups * E * t_noise_full + directions * E * t_acc
            g_noise, g_prod = gram_model_cost(
                shapes, E, args.gram_memory_gb, anc["gram_t_noise_per_element"], anc["gram_t_pair_per_element"]
            )
            g16 = sum(gram_model_cost(shapes, E, 16.0, anc["gram_t_noise_per_element"], anc["gram_t_pair_per_element"]))
            streamed = [m["name"] for m in anc["analysis_per_matrix"] if N * int(np.prod(m["shape"])) * 4 > budget]
            row = {
                "grid": gname,
                "N": N,
                "elites": E,
                "candidates": cands,
                "scoring_cpu_s": N * spec,
                "gram_cpu_s": g_noise + g_prod,
                "gram_noise_cpu_s": g_noise,
                "gram_products_cpu_s": g_prod,
                "gram_cpu_s_at_16gb": g16,
                "step_search_cpu_s": cands * (probe + anc["apply_cpu_s"]) + build,
                "step_build_cpu_s": build,
                "gates_cpu_s": 3 * val + probe,
                "analysis_cpu_s": anc["layers"] * (ana_const + N * layer_rate(N)),
                "analysis_const_cpu_s": anc["layers"] * ana_const,
                "analysis_streamed_matrices_per_layer": len(streamed),
            }
            parts = {
                k: v
                for k, v in row.items()
                if k in ("scoring_cpu_s", "gram_cpu_s", "step_search_cpu_s", "gates_cpu_s", "analysis_cpu_s")
            }
            row["total_cpu_s"] = sum(parts.values())
            row["dominant"] = max(parts, key=parts.get).replace("_cpu_s", "")
            out["cases"].append(row)
    # cross-check asked for: the tiny fits' per-parameter terms scaled by the parameter ratio
    ratio = P / tiny_params
    f = fits(runs) if len(runs) >= 2 else None
    if f:
        g = f["gram ~ a E + b E^2"]["terms"]
        out["tiny_scaled_by_param_ratio"] = {
            "ratio": ratio,
            "gram_cpu_s_at_E": {E: ratio * (g["E"] * E + g["E^2"] * E * E) for E in (250, 2500)},
            "note": (
                "tiny Gram fit x parameter ratio (one memory block assumed, so no regeneration): a lower bound; the "
                "tiny model's per-tensor overheads do not scale with parameters"
            ),
        }
    return out


def fmt_s(x: float) -> str:
    if x >= 3600:
        return f"{x / 3600:.1f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    return f"{x:.2f} s" if x < 10 else f"{x:.0f} s"


def table(runs, ext) -> str:
    lines = [
        "| N | elites | scoring (per specialist) | Gram | step search (candidates, "
        "per candidate) | gates | analysis | power sim | consolidate other |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        lines.append(
            f"| {r['N']} | {r['elites_widest']} | {r['scoring_cpu_s']:.1f} ({r['scoring_per_specialist_cpu_s']:.3f}) | "
            f"{r['gram_cpu_s']:.2f} | {r['step_search_cpu_s']:.2f} ({r['candidates']}, "
            f"{r['step_search_per_candidate_cpu_s']:.3f}) | {r['gates_cpu_s']:.2f} | {r['analysis_cpu_s']:.1f} | "
            f"{r['power_cpu_s']:.1f} | {r['consolidate_other_cpu_s']:.1f} |"
        )
    if ext.get("cases"):
        lines += [
            "",
            "| embedded model, grid | N | elites | candidates | scoring "
            "| Gram (exact) | step search | gates | analysis | dominant |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for c in ext["cases"]:
            lines.append(
                f"| {c['grid']} | {c['N']} | {c['elites']} | {c['candidates']} | {fmt_s(c['scoring_cpu_s'])} | "
                f"{fmt_s(c['gram_cpu_s'])} | {fmt_s(c['step_search_cpu_s'])} | {fmt_s(c['gates_cpu_s'])} | "
                f"{fmt_s(c['analysis_cpu_s'])} | {c['dominant']} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--populations", default="32,128,512")
    ap.add_argument("--n-support", type=int, default=64)
    ap.add_argument("--n-probe", type=int, default=32)
    ap.add_argument("--n-validation", type=int, default=64)
    ap.add_argument("--n-test", type=int, default=8, help="test rows are reporting, not selection; kept small")
    ap.add_argument(
        "--preset", default=None, help="'paper' for the paper's (q, beta, alpha) grids; default: corp's CPU grid"
    )
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--permutations", type=int, default=20)
    ap.add_argument(
        "--power-sims", type=int, default=32, help="analyze-rank's power simulation (its default 32); 0 skips it"
    )
    ap.add_argument("--gram-memory-gb", type=float, default=2.0)
    ap.add_argument("--anchor", action="store_true", help="also measure per-unit costs on the embedded model")
    ap.add_argument("--anchor-model", default="smollm2-135m")
    ap.add_argument("--anchor-specialists", type=int, default=3)
    ap.add_argument("--anchor-gram-k", default="32,128")
    ap.add_argument("--anchor-elites", type=int, default=4)
    ap.add_argument("--anchor-analysis-n", default="16,48")
    ap.add_argument(
        "--anchor-from", default=None, help="reuse the anchor block of an earlier results.json instead of measuring it"
    )
    ap.add_argument(
        "--runs-from", default=None, help="reuse the tiny rows of an earlier results.json instead of measuring them"
    )
    ap.add_argument("--out", default=None, help="write results.json and table.md here")
    args = ap.parse_args()
    args.anchor_gram_k = [int(x) for x in args.anchor_gram_k.split(",")]
    args.anchor_analysis_n = [int(x) for x in args.anchor_analysis_n.split(",")]

    import torch

    torch.set_num_threads(1)
    c_all, t_all = time.process_time(), time.perf_counter()
    model_dir, tiny_params = tiny_model_dir()
    if args.runs_from:
        runs = json.loads(Path(args.runs_from).read_text())["runs"]
    else:
        runs = [measure_n(model_dir, int(n), args) for n in args.populations.split(",") if n]
    anc = None
    if args.anchor_from:
        anc = json.loads(Path(args.anchor_from).read_text())["anchor"]
    elif args.anchor:
        anc = anchor(args)
    ext = extrapolate(runs, anc, tiny_params, args)
    out = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "tiny_params": tiny_params,
        "threads": 1,
        "splits": {
            "support": args.n_support,
            "probe": args.n_probe,
            "validation": args.n_validation,
            "test": args.n_test,
        },
        "preset": args.preset,
        "runs": runs,
        "fits": fits(runs) if len(runs) >= 2 else None,
        "anchor": anc,
        "extrapolation": ext,
        "script_cpu_s": time.process_time() - c_all,
        "script_wall_s": time.perf_counter() - t_all,
    }
    text = table(runs, ext)
    print(text)
    print(json.dumps(out["fits"], indent=1))
    print("\n".join(ext.get("assumptions", [])))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
        (Path(args.out) / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
