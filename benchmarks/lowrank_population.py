"""Population scoring on CPU: batched low-rank (one factored pass) vs full-rank one at a time (issue 26).

One process, one model, the same S specialists (seeds of master seed 0, one sigma) and the same M
support prompts of the task, greedy, side by side:

- `full`: the current path, full-rank noise (`corp-noise-v2`): per specialist, apply W0 + sigma eps
  (Perturber), generate the M prompts (one batch), restore.
- `lowrank_batched`: `--noise lowrank:r=R` as the scorer runs it on hf: every specialist's factors
  drawn, S x M rows in `generate` calls of --batch rows, no weight written
  (`corp.runtime.backends.batched_lowrank.population_generations`).
- `lowrank_alone`: the same low-rank specialists materialised one at a time (apply, generate,
  restore): the reference the batched pass must equal, and the apply + restore time of a low-rank
  specialist against its scoring time.
- `plain`: the base model generating the same S x M rows in the same batches: the ceiling.

Specialists/hour = S / seconds (apply, noise draws and restore included); CPU seconds of the
process (time.process_time, all its threads) are recorded too, the stabler figure on a shared machine. Answers of
`lowrank_batched` and `lowrank_alone` are compared (the agreement is reported). The load average
before and after is recorded: on a shared machine the figures move with it.

    python benchmarks/lowrank_population.py --specialists 8 --prompts 16 --threads 2 --out results/lowrank-population

`--model tiny` builds a random 2-layer Llama (character tokenizer) instead of loading the embedded model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import corp  # noqa: E402,F401  before torch, as the CLI does (corp's OpenMP wait policy)
import torch  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias or HF directory, or 'tiny' (random 2-layer Llama)")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--specialists", type=int, default=8, help="S")
    ap.add_argument("--prompts", type=int, default=16, help="M: support prompts every specialist answers")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's")
    ap.add_argument(
        "--batch", type=int, default=128, help="rows per generate call of the batched pass and of plain generation"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="directory for results.json")
    return ap.parse_args()


def tiny_model_dir() -> str:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import make_char_tokenizer, make_tiny_llama

    d = tempfile.mkdtemp(prefix="corp-tiny-")
    tok = make_char_tokenizer()
    make_tiny_llama(tok, hidden=64).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    from corp.runtime.backends.batched_lowrank import FactoredPopulation, population_generations
    from corp.runtime.backends.hf import HFBackend
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits
    from corp.runtime.models import load_model
    from corp.algorithms.perturb import SCHEME_VERSION, Direction, specialist_seeds
    from corp.algorithms.perturb.lowrank_noise import lowrank_scheme

    name = tiny_model_dir() if args.model == "tiny" else args.model
    model, tok, model_id, _ = load_model(name, device="cpu", dtype="float32")
    task = get_task(args.task)
    prompts = [e.prompt for e in make_splits(task, SplitSizes(args.prompts, 0, 0, 0), 0)["support"]]
    max_new = args.max_new_tokens or task.max_new_tokens
    stop = task.stop or None
    scheme = lowrank_scheme(args.rank)
    specs = [(s, args.sigma) for s in specialist_seeds(0, args.specialists)]
    S, M = len(specs), len(prompts)
    full = HFBackend(model, tok, batch_size=max(M, 1), scheme=SCHEME_VERSION)
    low = HFBackend(
        model, tok, batch_size=args.batch, scheme=scheme
    )  # the same model: one of the two writes it at a time
    out: dict = {
        "model": model_id,
        "task": task.signature(),
        "S": S,
        "M": M,
        "rank": args.rank,
        "sigma": args.sigma,
        "max_new_tokens": max_new,
        "batch_rows": args.batch,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_before": loadavg(),
    }
    print(
        f"{model_id}: S={S} specialists x M={M} prompts, max_new_tokens={max_new}, "
        f"rank {args.rank}, {args.threads} threads; load {out['loadavg_before']}",
        flush=True,
    )

    def one_at_a_time(backend, label):
        t_all, c_all = time.perf_counter(), time.process_time()
        apply_s, restore_s, gen_s, tokens, answers = [], [], [], 0, []
        for seed, sigma in specs:
            t0 = time.perf_counter()
            backend.set_direction(Direction.single(seed, sigma))
            apply_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            g = backend.generate(prompts, max_new, stop=stop)
            gen_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            backend.set_direction(None)
            restore_s.append(time.perf_counter() - t0)
            tokens += sum(g.generated_tokens)
            answers.append(g.texts)
        wall, cpu = time.perf_counter() - t_all, time.process_time() - c_all
        r = {
            "seconds": wall,
            "cpu_seconds": cpu,
            "specialists_per_hour": S * 3600 / wall,
            "apply_s_mean": sum(apply_s) / S,
            "restore_s_mean": sum(restore_s) / S,
            "generate_s_mean": sum(gen_s) / S,
            "generated_tokens": tokens,
        }
        print(
            f"{label}: {wall:.1f} s ({cpu:.1f} CPU s), {r['specialists_per_hour']:.0f} "
            f"specialists/h; apply {r['apply_s_mean']:.3f} s, restore {r['restore_s_mean']:.3f} "
            f"s, generate {r['generate_s_mean']:.2f} s per specialist; {tokens} tokens",
            flush=True,
        )
        return r, answers

    t0 = time.perf_counter()
    full.generate(prompts, max_new, stop=stop)  # warm-up, untimed: the first generate of a process pays allocations
    full.set_direction(Direction.single(*specs[0]))
    full.set_direction(None)
    out["warmup_s"] = time.perf_counter() - t0
    out["full"], _ = one_at_a_time(full, "full-rank one at a time")

    factored = FactoredPopulation(low.model, low.perturber.params, scheme)
    t0, c0 = time.perf_counter(), time.process_time()
    batched = {i: g for i, g, _ in population_generations(low, factored, specs, prompts, max_new, stop)}
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    toks = sum(sum(g.generated_tokens) for g in batched.values())
    out["lowrank_batched"] = {
        "seconds": wall,
        "cpu_seconds": cpu,
        "specialists_per_hour": S * 3600 / wall,
        "generated_tokens": toks,
    }
    print(
        f"low-rank batched: {wall:.1f} s ({cpu:.1f} CPU s), {S * 3600 / wall:.0f} specialists/h; {toks} tokens",
        flush=True,
    )

    out["lowrank_alone"], alone = one_at_a_time(low, "low-rank one at a time (materialised)")
    agree = sum(a == b for i in range(S) for a, b in zip(alone[i], batched[i].texts))
    out["agreement"] = {"same_text": agree, "of": S * M}
    la = out["lowrank_alone"]
    out["lowrank_apply_restore_share"] = (la["apply_s_mean"] + la["restore_s_mean"]) / la["generate_s_mean"]
    print(
        f"batched vs materialised low-rank: {agree}/{S * M} identical completions; low-rank apply+restore = "
        f"{100 * out['lowrank_apply_restore_share']:.1f}% of its scoring time",
        flush=True,
    )

    rows = [p for _ in specs for p in prompts]
    t0, c0 = time.perf_counter(), time.process_time()
    plain = [low.generate(rows[i : i + args.batch], max_new, stop=stop) for i in range(0, len(rows), args.batch)]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    toks = sum(sum(g.generated_tokens) for g in plain)
    out["plain"] = {
        "seconds": wall,
        "cpu_seconds": cpu,
        "specialists_per_hour": S * 3600 / wall,
        "generated_tokens": toks,
    }
    print(
        f"plain batched generation of the same rows (base model): {wall:.1f} s ({cpu:.1f} CPU s); {toks} tokens",
        flush=True,
    )
    for key in ("full", "lowrank_batched", "lowrank_alone"):  # CPU seconds: the stabler figure on a shared machine
        out[f"cpu_ratio_plain_over_{key}"] = out["plain"]["cpu_seconds"] / out[key]["cpu_seconds"]
    out["ratio_batched_over_full"] = (
        out["lowrank_batched"]["specialists_per_hour"] / out["full"]["specialists_per_hour"]
    )
    out["ratio_batched_over_plain"] = (
        out["lowrank_batched"]["specialists_per_hour"] / out["plain"]["specialists_per_hour"]
    )
    out["loadavg_after"] = loadavg()
    print(
        f"batched low-rank / full-rank one at a time: {out['ratio_batched_over_full']:.2f}x; batched low-rank / plain "
        f"generation: {out['ratio_batched_over_plain']:.2f}; load {out['loadavg_after']}",
        flush=True,
    )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "results.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
