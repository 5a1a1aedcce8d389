"""CoRP step search: non-generation time vs evaluation time per probe candidate (issue 16).

For each population size N (synthetic rewards: the cost does not depend on their values), stage 1
at one (q = 0.5, beta = 10) gives the elites E (about N / 2) and the merged directions of the
configured rules (m2, m1). They are searched as `corp consolidate` searches them: the Perturber
first builds every rule's M together, in one pass over the elites' noise (`build`), then each
candidate sets W0 + alpha * M (`apply`) and generates on the probe split (`gen`; skipped where N is
not in --generate-at, since generation does not depend on N). Once per N it also times `old`:
applying a candidate as plain per-elite components (alpha folded into each coefficient), which
is what every candidate cost before merged directions were materialised.
Wall and CPU seconds (time.process_time, one torch thread) are both recorded: on a machine shared
with other jobs the CPU seconds are the stabler figure. Non-generation time per candidate =
(build + all applies) / candidates, about
  E * (t_noise + D * t_accumulate) / (D * A) + t_apply
for D directions of A alphas each: linear in N, amortised over the candidates that share the
build; the old path paid E * (t_noise + t_accumulate) on every candidate.

    python benchmarks/step_search.py --model smollm2-135m --populations 32 --threads 1 --out results/step-search
    python benchmarks/step_search.py --model tiny --populations 32,256 --generate-at 32,256 --threads 1 --out results/step-search

`--paths dense,factored` (a low-rank population, `--noise lowrank:r=R`) also searches the same
candidates as `corp consolidate` now does on such a population, in the same process right after
the dense path: each rule's m as one factor pair per matrix (`FactoredPopulation.direction_factors`,
`draw`: the elites' factors, nothing m x n), every alpha that pair scaled, the alphas as row groups
of batched `generate` calls with the hooks installed (`install`) and the base weights in place
(`corp.runtime.backends.batched_lowrank.direction_generations`). `plain` (the base generating the
probe, no hooks) is timed before and after each N: the hooks' products are generation time, so the
factored path's cost over plain generation is reported beside its non-generation share. Answers of
the two paths are compared per candidate.

`--model tiny` is a random 2-layer Llama (hidden 64, character tokenizer, 86,720 parameters) built in
a temporary directory: no download, well under a second per candidate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# before torch, as the CLI does: corp's OpenMP wait policy applies only if set before torch loads OpenMP
import corp  # noqa: E402,F401
import torch  # noqa: E402


def tiny_model_dir() -> str:
    sys.path.insert(0, str(REPO))
    from tests.conftest import make_char_tokenizer, make_tiny_llama

    d = Path(tempfile.mkdtemp(prefix="corp-bench-step-"))
    tok = make_char_tokenizer()
    make_tiny_llama(tok, hidden=64).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def timed_plain(ctx, probe) -> tuple[float, float]:
    """Wall and CPU seconds of the base generating the probe (no hooks, no direction)."""
    from corp.runtime.context import evaluate_current

    ctx.backend.set_direction(None)
    t0, c0 = time.perf_counter(), time.process_time()
    evaluate_current(ctx, probe)
    return time.perf_counter() - t0, time.process_time() - c0


def factored_search(ctx, factored, st, perts, rules, alphas, probe, dense_texts) -> dict:
    """The candidates of every rule in the factored pass, as RunScorer evaluates them: draw each m's
    factors once, generate its alphas as row groups of batched calls; wall and CPU seconds."""
    from corp.runtime.backends.batched_lowrank import direction_generations

    rows, draw, draw_cpu = [], 0.0, 0.0
    for rule in rules:
        m = st.direction(perts, rule)
        t0, c0 = time.perf_counter(), time.process_time()
        unit, _ = factored.direction_factors(m)
        draw, draw_cpu = draw + time.perf_counter() - t0, draw_cpu + time.process_time() - c0
        rank = max(A.shape[1] for A, _ in unit.values())
        t0, c0 = time.perf_counter(), time.process_time()
        gens = list(
            direction_generations(
                ctx.backend,
                factored,
                unit,
                alphas,
                [e.prompt for e in probe],
                ctx.max_new_tokens,
                ctx.task.stop or None,
            )
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        for i, g, install in gens:
            same = None
            if (rule, alphas[i]) in dense_texts:
                same = sum(a == b for a, b in zip(g.texts, dense_texts[(rule, alphas[i])]))
            rows.append(
                {
                    "rule": rule,
                    "alpha": alphas[i],
                    "rank": rank,
                    "install_s": install,
                    "gen_s": wall / len(alphas) - install,
                    "gen_cpu_s": cpu / len(alphas),
                    "same_answers_as_dense": same,
                }
            )
            print(json.dumps({"factored": True, **rows[-1]}), flush=True)
    n = len(rows)
    return {
        "candidates": n,
        "rank_per_matrix": rows[0]["rank"] if rows else None,
        "draw_s": draw,
        "draw_cpu_s": draw_cpu,
        "install_s_total": sum(r["install_s"] for r in rows),
        "non_generation_per_candidate_s": (draw + sum(r["install_s"] for r in rows)) / n,
        "non_generation_per_candidate_cpu_s": draw_cpu / n,  # installs are views: their CPU time is in gen_cpu_s
        "generation_per_candidate_s": statistics.median(r["gen_s"] for r in rows),
        "generation_per_candidate_cpu_s": statistics.median(r["gen_cpu_s"] for r in rows),
        "same_answers_as_dense": sum(r["same_answers_as_dense"] or 0 for r in rows),
        "answers_compared": sum(len(probe) for r in rows if r["same_answers_as_dense"] is not None),
        "rows": rows,
    }


def summarise(run: dict) -> None:
    """Shares of each path: non-generation / (non-generation + generation) per candidate, and the
    cost over plain generation, (per-candidate time - plain) / per-candidate time."""
    plain = statistics.median(run["plain_generation_s"])
    plain_cpu = statistics.median(run["plain_generation_cpu_s"])
    for path in ("dense", "factored"):
        r = run.get(path)
        if not r or r.get("generation_per_candidate_s") is None:
            continue
        for unit, ng, gen, base in (
            ("wall", r["non_generation_per_candidate_s"], r["generation_per_candidate_s"], plain),
            ("cpu", r["non_generation_per_candidate_cpu_s"], r["generation_per_candidate_cpu_s"], plain_cpu),
        ):
            total = ng + gen
            r[f"share_non_generation_{unit}"] = ng / total
            r[f"per_candidate_{unit}_s"] = total
            r[f"share_over_plain_{unit}"] = (total - base) / total
    if run.get("dense", {}).get("per_candidate_cpu_s") and run.get("factored", {}).get("per_candidate_cpu_s"):
        run["factored_over_dense_cpu"] = run["factored"]["per_candidate_cpu_s"] / run["dense"]["per_candidate_cpu_s"]
    print(
        json.dumps(
            {
                "N": run["N"],
                "summary": {
                    p: {k: v for k, v in run[p].items() if k.startswith(("share", "per_candidate"))}
                    for p in ("dense", "factored")
                    if p in run
                },
                "plain_s": run["plain_generation_s"],
                "plain_cpu_s": run["plain_generation_cpu_s"],
            }
        ),
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a corp model name, or 'tiny' (random tiny Llama)")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--populations", default="32,256")
    ap.add_argument("--generate-at", default="32", help="population sizes at which candidates are also generated")
    ap.add_argument("--alphas", default="1,2,4,8")
    ap.add_argument("--rules", default="pass2,pass1")
    ap.add_argument("--n-probe", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--noise", default="full", help="noise scheme of the population: full or lowrank:r=R")
    ap.add_argument("--paths", default="dense", help="dense, factored (low-rank populations) or dense,factored")
    ap.add_argument("--out", default=None, help="write results.json here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from corp.config import PopulationConfig, load_config
    from corp.algorithms.corp_operator.stage1 import keep_together, stage1
    from corp.algorithms.corp_operator.algebra import perturbation_grams
    from corp.runtime.context import evaluate_current, setup_run
    from corp.algorithms.perturb import Direction, specialist_seeds

    model = tiny_model_dir() if args.model == "tiny" else args.model
    cfg = load_config(
        PopulationConfig,
        None,
        {
            "model": model,
            "task": args.task,
            "n_support": 0,
            "n_probe": args.n_probe,
            "n_validation": 0,
            "n_test": 0,
            "threads": args.threads,
            "noise": args.noise,
            "run_dir": tempfile.mkdtemp(prefix="corp-bench-step-run-"),
        },
    )
    ctx = setup_run(cfg, "bench", needs=("probe",))
    backend, probe = ctx.backend, ctx.splits["probe"]
    n_params = backend.perturber.n_selected
    params = [(n, p.shape) for n, p in backend.perturber.params]
    alphas = [float(a) for a in args.alphas.split(",")]
    rules = args.rules.split(",")
    generate_at = {int(x) for x in args.generate_at.split(",") if x}
    evaluate_current(ctx, probe[:4])  # warm-up

    out = {
        "model": args.model,
        "noise_scheme": backend.perturber.scheme,
        "n_params": n_params,
        "threads": args.threads,
        "n_probe": len(probe),
        "alphas": alphas,
        "rules": rules,
        "runs": [],
    }
    paths = args.paths.split(",")
    out["paths"] = paths
    if "factored" in paths:
        from corp.runtime.backends.batched_lowrank import FactoredPopulation

        factored = FactoredPopulation(backend.model, backend.perturber.params, backend.perturber.scheme)
    gen_times: list[float] = []
    for N in [int(x) for x in args.populations.split(",")]:
        seeds = specialist_seeds(0, N)
        sigmas = [(5e-4, 1e-3, 2e-3)[i % 3] for i in range(N)]
        rewards = np.random.default_rng(N).random(N)
        perts = [Direction.single(s, sg) for s, sg in zip(seeds, sigmas)]
        _, G_apx = perturbation_grams(perts, params, None, 2.0, False)
        st = stage1(rewards, 0.5, 10.0, None, G_apx, rules)
        plain = [timed_plain(ctx, probe)]
        run = {"N": N, "elites": len(st.elite), "directions": len(rules)}
        texts = {}
        if "dense" in paths:
            rows = []
            t0, c0 = time.perf_counter(), time.process_time()
            keep_together(backend.perturber, [st.direction(perts, rule) for rule in rules])
            t_build, c_build = time.perf_counter() - t0, time.process_time() - c0
            print(json.dumps({"N": N, "build_s": t_build, "build_cpu_s": c_build}), flush=True)
            for rule in rules:
                m = st.direction(perts, rule)
                for alpha in alphas:
                    t0, c0 = time.perf_counter(), time.process_time()
                    backend.set_direction(m.scaled(alpha))
                    t_apply, c_apply = time.perf_counter() - t0, time.process_time() - c0
                    t_gen = c_gen = None
                    if N in generate_at:
                        t0, c0 = time.perf_counter(), time.process_time()
                        res = evaluate_current(ctx, probe)
                        t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
                        texts[(rule, alpha)] = res.completions
                        gen_times.append((t_gen, c_gen))
                    rows.append(
                        {
                            "rule": rule,
                            "alpha": alpha,
                            "apply_s": t_apply,
                            "apply_cpu_s": c_apply,
                            "gen_s": t_gen,
                            "gen_cpu_s": c_gen,
                        }
                    )
                    print(json.dumps({"N": N, **rows[-1]}), flush=True)
            backend.perturber.release_merged()
            t_old = c_old = None
            if paths == ["dense"]:  # the path before merged terms; not repeated beside the factored one
                flat = Direction(st.direction(perts, rules[0]).scaled(alphas[0]).seed_components())
                t0, c0 = time.perf_counter(), time.process_time()
                backend.set_direction(flat)
                t_old, c_old = time.perf_counter() - t0, time.process_time() - c0
            backend.set_direction(None)
            gen = statistics.median(g for g, _ in gen_times) if gen_times else None
            gen_cpu = statistics.median(c for _, c in gen_times) if gen_times else None
            per_cand = (t_build + sum(r["apply_s"] for r in rows)) / len(rows)
            per_cand_cpu = (c_build + sum(r["apply_cpu_s"] for r in rows)) / len(rows)
            run["dense"] = {
                "candidates": len(rows),
                "build_s": t_build,
                "build_cpu_s": c_build,
                "apply_kept_s_median": statistics.median(r["apply_s"] for r in rows),
                "apply_kept_cpu_s_median": statistics.median(r["apply_cpu_s"] for r in rows),
                "non_generation_per_candidate_s": per_cand,
                "non_generation_per_candidate_cpu_s": per_cand_cpu,
                "old_apply_per_candidate_s": t_old,
                "old_apply_per_candidate_cpu_s": c_old,
                "generation_per_candidate_s": gen,
                "generation_per_candidate_cpu_s": gen_cpu,
                "generation_measured_here": N in generate_at,
                "ratio_non_generation_to_generation": per_cand / gen if gen else None,
                "ratio_cpu": per_cand_cpu / gen_cpu if gen_cpu else None,
                "old_ratio": t_old / gen if gen and t_old is not None else None,
                "old_ratio_cpu": c_old / gen_cpu if gen_cpu and c_old is not None else None,
                "rows": rows,
            }
        if "factored" in paths:
            run["factored"] = factored_search(ctx, factored, st, perts, rules, alphas, probe, texts)
            f = run["factored"]
            print(json.dumps({"N": N, **{k: v for k, v in f.items() if k != "rows"}}), flush=True)
        plain.append(timed_plain(ctx, probe))
        run["plain_generation_s"] = [p[0] for p in plain]
        run["plain_generation_cpu_s"] = [p[1] for p in plain]
        summarise(run)
        out["runs"].append(run)
        print(json.dumps({k: v for k, v in run.items() if k not in ("rows", "dense", "factored")}), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tag = "" if paths == ["dense"] else "-" + "-".join(paths)
        (Path(args.out) / f"results-{Path(str(args.model)).name}{tag}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
