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
    ap.add_argument("--out", default=None, help="write results.json here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from corp.config import PopulationConfig, load_config
    from corp.consolidate.corp_operator import keep_together, stage1
    from corp.consolidate.algebra import perturbation_grams
    from corp.evaluate.context import evaluate_current, setup_run
    from corp.perturb import Direction, specialist_seeds

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
    gen_times: list[float] = []
    for N in [int(x) for x in args.populations.split(",")]:
        seeds = specialist_seeds(0, N)
        sigmas = [(5e-4, 1e-3, 2e-3)[i % 3] for i in range(N)]
        rewards = np.random.default_rng(N).random(N)
        perts = [Direction.single(s, sg) for s, sg in zip(seeds, sigmas)]
        _, G_apx = perturbation_grams(perts, params, None, 2.0, False)
        st = stage1(rewards, 0.5, 10.0, None, G_apx, rules)
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
                    evaluate_current(ctx, probe)
                    t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
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
        flat = Direction(st.direction(perts, rules[0]).scaled(alphas[0]).seed_components())
        t0, c0 = time.perf_counter(), time.process_time()
        backend.set_direction(flat)
        t_old, c_old = time.perf_counter() - t0, time.process_time() - c0
        backend.set_direction(None)
        gen = statistics.median(g for g, _ in gen_times) if gen_times else None
        gen_cpu = statistics.median(c for _, c in gen_times) if gen_times else None
        per_cand = (t_build + sum(r["apply_s"] for r in rows)) / len(rows)
        per_cand_cpu = (c_build + sum(r["apply_cpu_s"] for r in rows)) / len(rows)
        run = {
            "N": N,
            "elites": len(st.elite),
            "directions": len(rules),
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
            "old_ratio": t_old / gen if gen else None,
            "old_ratio_cpu": c_old / gen_cpu if gen_cpu else None,
            "rows": rows,
        }
        out["runs"].append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "rows"}), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"results-{Path(str(args.model)).name}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
