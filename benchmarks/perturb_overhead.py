"""Perturbation overhead of population scoring, measured side by side with plain generation.

On the embedded model and the default task (arith), for R interleaved repetitions:
  plain   : batched greedy generation of the support prompts by the unperturbed model;
  apply   : set the weights to base + sigma * eps(seed) (fresh seed each time);
  score   : generate + extract + reward on the same prompts (what the scorer does per specialist);
  restore : copy the pristine base back.
Reports medians, the overhead (apply + restore) / score, the scoring throughput relative to plain
generation, and peak RSS against the model's size. Targets (issue 2): overhead <= 5% of scoring
time; throughput >= 0.9 of plain generation.

With --compare-schemes, each rep also applies a specialist under every known noise scheme (same
Perturber, same buffer) and draws the whole model's noise once per scheme without applying it, so
schemes are compared side by side in one process under the same machine load (issue 10: v2's
128-bit key must not slow the perturbation path).

    python benchmarks/perturb_overhead.py --n-support 64 --reps 5 --out results/perturb-overhead
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--n-support", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="directory for README.md with the table")
    ap.add_argument(
        "--compare-schemes",
        action="store_true",
        help="also time apply and noise generation under every known noise scheme, interleaved",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from corp.config import PopulationConfig, load_config
    from corp.runtime.context import evaluate_current, setup_run
    from corp.algorithms.perturb import SCHEME_VERSION, SCHEMES, Direction, noise

    cfg = load_config(
        PopulationConfig,
        None,
        {
            "model": args.model,
            "task": args.task,
            "n_support": args.n_support,
            "n_probe": 0,
            "n_validation": 0,
            "n_test": 0,
            "run_dir": "/tmp/corp-bench-perturb",
        },
    )
    ctx = setup_run(cfg, "bench", needs=("support",))
    backend = ctx.backend
    prompts = [e.prompt for e in ctx.splits["support"]]
    model_bytes = sum(p.numel() * p.element_size() for p in backend.model.parameters())
    rss_after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    backend.set_direction(Direction.single(0, args.sigma))  # warm-up: first touch of the noise buffer
    backend.generate(prompts[:4], ctx.max_new_tokens)
    backend.set_direction(None)

    pert = backend.perturber
    gen = torch.Generator(device="cpu")
    nbuf = torch.empty(max(p.numel() for _, p in pert.params), dtype=torch.float32) if args.compare_schemes else None

    def scheme_times(rep: int) -> dict[str, tuple[float, float, float, float]]:
        """(apply wall, apply CPU, noise-only wall, noise-only CPU) seconds per scheme; the backend is
        back at the base and SCHEME_VERSION after. CPU time (this process) is what to compare on a
        shared machine: wall time there is mostly waiting for a core."""
        out = {}
        for scheme in SCHEMES if rep % 2 == 0 else SCHEMES[::-1]:  # alternate the order: no scheme always runs first
            pert.scheme = scheme  # one Perturber materialises under one scheme; switched here only to compare
            t, c = time.perf_counter(), time.process_time()
            backend.set_direction(Direction.single(2000 + rep, args.sigma))
            a, ac = time.perf_counter() - t, time.process_time() - c
            backend.set_direction(None)
            t, c = time.perf_counter(), time.process_time()
            for name, p in pert.params:
                noise(3000 + rep, name, p.shape, gen, out=nbuf[: p.numel()].view(p.shape), scheme=scheme)
            out[scheme] = (a, ac, time.perf_counter() - t, time.process_time() - c)
        pert.scheme = SCHEME_VERSION
        return out

    rows, by_scheme = [], []
    for rep in range(args.reps):
        t = time.perf_counter()
        backend.generate(prompts, ctx.max_new_tokens)
        plain = time.perf_counter() - t
        t = time.perf_counter()
        backend.set_direction(Direction.single(1000 + rep, args.sigma))
        apply_s = time.perf_counter() - t
        t = time.perf_counter()
        res = evaluate_current(ctx, ctx.splits["support"])
        score = time.perf_counter() - t
        t = time.perf_counter()
        backend.set_direction(None)
        restore = time.perf_counter() - t
        rows.append((plain, apply_s, score, restore))
        print(
            f"rep {rep}: plain {plain:.2f}s  apply {apply_s:.3f}s  score "
            f"{score:.2f}s  restore {restore:.3f}s  reward {res.mean_reward:.3f}",
            file=sys.stderr,
        )
        if args.compare_schemes:
            by_scheme.append(scheme_times(rep))
            print(
                f"rep {rep}: "
                + "  ".join(
                    f"{k}: apply {a:.3f}s (cpu {ac:.3f}s) noise {n:.3f}s (cpu {nc:.3f}s)"
                    for k, (a, ac, n, nc) in by_scheme[-1].items()
                ),
                file=sys.stderr,
            )

    med = [statistics.median(c) for c in zip(*rows)]
    plain, apply_s, score, restore = med
    overhead = (apply_s + restore) / score
    per_spec = statistics.median(r[1] + r[2] + r[3] for r in rows)
    throughput_ratio = statistics.median(r[0] / (r[1] + r[2] + r[3]) for r in rows)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    lines = [
        f"model {args.model} ({model_bytes / 2**20:.0f} MiB of parameters, {backend.n_params / 1e6:.1f}M params), "
        f"task {args.task}, {len(prompts)} support prompts, sigma {args.sigma}, {args.reps} interleaved reps, torch "
        f"threads {args.threads}, noise scheme {SCHEME_VERSION}; medians:",
        "",
        "| quantity | median |",
        "| --- | ---: |",
        f"| plain batched generation (unperturbed) | {plain:.2f} s |",
        f"| apply one specialist | {apply_s:.3f} s |",
        f"| restore | {restore:.3f} s |",
        f"| score one specialist (generate + reward) | {score:.2f} s |",
        f"| overhead (apply + restore) / score | {overhead * 100:.1f} % (target <= 5 %) |",
        f"| specialists per hour | {3600 / per_spec:.0f} |",
        f"| plain generations per hour | {3600 / plain:.0f} |",
        "| scoring throughput / plain generation (median of "
        f"per-rep ratios) | {throughput_ratio:.3f} (target >= 0.9) |",
        f"| peak RSS | {peak / 2**20:.0f} MiB = {peak / model_bytes:.2f} "
        f"x model size (after load: {rss_after_load / 2**20:.0f} MiB) |",
    ]
    for scheme in SCHEMES if by_scheme else ():
        a, ac, n, nc = (statistics.median(r[scheme][i] for r in by_scheme) for i in range(4))
        lines.append(
            f"| {scheme}: apply one specialist, wall / CPU (same process, interleaved) | {a:.3f} s / {ac:.3f} s |"
        )
        lines.append(f"| {scheme}: draw all its noise only, wall / CPU | {n:.3f} s / {nc:.3f} s |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cmd = "python benchmarks/perturb_overhead.py " + " ".join(sys.argv[1:])
        (out / "README.md").write_text(
            f"# Perturbation overhead\n\nCommand (from the repo root, venv active):\n\n    {cmd}\n\n{text}\n"
        )


if __name__ == "__main__":
    main()
