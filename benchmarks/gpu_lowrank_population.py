"""Population throughput on a GPU: batched low-rank vs full-rank one at a time, as ratios of plain
batched generation (issue 26). No download: a randomly initialised Qwen2.5-1.5B-shaped model
built from its config (torch and transformers only, plus this checkout's corp).

Random prompts (token ids, fixed length), greedy, every row generating exactly --new-tokens
tokens (min_new_tokens = max_new_tokens, so all paths do the same work). Side by side, one run:

- `plain`: the base model generating all S x M rows in batches of --batch rows (the ceiling);
- `lowrank_batched`: the same rows, each specialist's rank-R perturbation added by corp's
  `FactoredPopulation` hooks (`corp.runtime.backends.batched_lowrank`), no weight written;
- `full_alone`: per specialist, the Perturber writes W0 + sigma eps in place (full-rank noise
  drawn on the CPU, as corp does everywhere, copied to the GPU; no reload), its M rows are
  generated in one batch, then the base is restored.
- `full_prefetch` (issue 36): the hf engine's path on a GPU: in-place apply from the pristine copy,
  with the next specialist's W0 + sigma eps built on CPU threads while this one generates
  (`Perturber.prefetch`), no restore in between (apply starts from the pristine copy anyway).
Peak GPU memory is reported for each path.

Reported: seconds and specialists/hour of each, and each path's specialists/hour over plain's.
`--tiny`: a 2-layer Qwen2 of hidden 64 on the CPU in fp32 (checks the script, measures nothing).
The script stops starting full-rank specialists when --budget-s is spent (the figure is then
per specialist scored).

    python benchmarks/gpu_lowrank_population.py --out results/gpu-lowrank-population
    python benchmarks/gpu_lowrank_population.py --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import corp  # noqa: E402,F401  before torch (corp's OpenMP defaults)
import torch  # noqa: E402

QWEN25_15B = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen2 on the CPU: checks the script")
    ap.add_argument("--specialists", type=int, default=8, help="S")
    ap.add_argument("--prompts", type=int, default=32, help="M: prompts per specialist")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256, help="rows per generate (plain and batched low-rank)")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=120.0,
        help="stop starting full-rank specialists after this many seconds of that path",
    )
    ap.add_argument("--out", default=None)
    return ap.parse_args()


def peak_gib(device):
    """Peak GPU memory since the last reset (None on the CPU), then reset for the next path."""
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    args = parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from corp.runtime.backends.batched_lowrank import FactoredPopulation
    from corp.algorithms.perturb import Direction, Perturber, specialist_seeds
    from corp.algorithms.perturb.lowrank_noise import lowrank_scheme

    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    t0 = time.perf_counter()
    torch.manual_seed(0)
    cfg = Qwen2Config(**(TINY if args.tiny else QWEN25_15B), pad_token_id=0, eos_token_id=1, bos_token_id=None)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    S, M = args.specialists, args.prompts
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, cfg.vocab_size, (M, args.prompt_len), generator=gen)
    specs = [(s, args.sigma) for s in specialist_seeds(0, S)]
    scheme = lowrank_scheme(args.rank)
    kw = dict(
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=1,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    out = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or platform.machine(),
        "model": "Qwen2.5-1.5B-shaped, random" if not args.tiny else "tiny Qwen2, random",
        "n_params": n_params,
        "dtype": str(dtype),
        "S": S,
        "M": M,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "batch_rows": args.batch,
        "rank": args.rank,
        "sigma": args.sigma,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "build_s": build_s,
    }
    print(
        f"{out['model']} ({n_params / 1e9:.2f}B params, {dtype}) on {out['device']}: S={S} x M={M}, "
        f"{args.prompt_len}+{args.new_tokens} tokens, built in {build_s:.1f} s",
        flush=True,
    )

    rows = prompts.repeat(S, 1)  # specialist-major: rows [s * M + k] = prompt k of specialist s

    @torch.inference_mode()
    def generate(ids):
        return model.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids, device=device), **kw)

    generate(rows[: min(len(rows), 8)])  # warm-up (kernels, allocator)
    peak_gib(device)  # reset: each path's peak is its own (the weights included)
    sync(device)
    t0 = time.perf_counter()
    for i in range(0, len(rows), args.batch):
        generate(rows[i : i + args.batch])
    sync(device)
    plain = time.perf_counter() - t0
    out["plain"] = {"seconds": plain, "specialists_per_hour": S * 3600 / plain, "peak_gpu_gib": peak_gib(device)}
    print(f"plain batched generation: {plain:.2f} s ({S * 3600 / plain:.0f} specialists/h)", flush=True)

    named = [(n, p) for n, p in model.named_parameters()]
    factored = FactoredPopulation(model, named, scheme)
    per_batch = min(M, args.batch)
    group = max(1, args.batch // per_batch)
    t0 = time.perf_counter()
    draw_s = 0.0
    with factored.hooks():
        for first in range(0, S, group):
            members = list(range(first, min(first + group, S)))
            t1 = time.perf_counter()
            factored.set_group([factored.draw(specs[i][0]) for i in members], [specs[i][1] for i in members])
            draw_s += time.perf_counter() - t1
            for start in range(0, M, per_batch):
                generate(torch.cat([prompts[start : start + per_batch] for _ in members]))
    sync(device)
    batched = time.perf_counter() - t0
    out["lowrank_batched"] = {
        "seconds": batched,
        "specialists_per_hour": S * 3600 / batched,
        "factor_draw_s": draw_s,
        "peak_gpu_gib": peak_gib(device),
    }
    print(
        f"batched low-rank: {batched:.2f} s ({S * 3600 / batched:.0f} specialists/h; factors drawn in {draw_s:.2f} s)",
        flush=True,
    )

    torch.set_num_threads(os.cpu_count() or 1)
    pert = Perturber(model)  # full-rank corp-noise-v2, drawn on the CPU
    done, apply_s, gen_s = 0, 0.0, 0.0
    t0 = time.perf_counter()
    for seed, sigma in specs:
        if time.perf_counter() - t0 > args.budget_s:
            break
        t1 = time.perf_counter()
        pert.apply(Direction.single(seed, sigma))
        sync(device)
        t2 = time.perf_counter()
        for start in range(0, M, per_batch):
            generate(prompts[start : start + per_batch])
        sync(device)
        t3 = time.perf_counter()
        pert.restore()
        sync(device)
        apply_s += (t2 - t1) + (time.perf_counter() - t3)
        gen_s += t3 - t2
        done += 1
    full = time.perf_counter() - t0
    out["full_alone"] = {
        "seconds": full,
        "specialists": done,
        "specialists_per_hour": done * 3600 / full,
        "apply_restore_s_per_specialist": apply_s / max(done, 1),
        "generate_s_per_specialist": gen_s / max(done, 1),
        "peak_gpu_gib": peak_gib(device),
    }
    print(
        f"full-rank one at a time: {done} specialists in {full:.2f} s ({done * 3600 / full:.0f} specialists/h; "
        f"apply+restore {apply_s / max(done, 1):.2f} s, generate {gen_s / max(done, 1):.2f} s each)",
        flush=True,
    )
    done, apply_s, gen_s = 0, 0.0, 0.0
    t0 = time.perf_counter()
    for i, (seed, sigma) in enumerate(specs):
        if time.perf_counter() - t0 > args.budget_s:
            break
        t1 = time.perf_counter()
        pert.apply(Direction.single(seed, sigma))
        if i + 1 < len(specs):
            pert.prefetch(Direction.single(*specs[i + 1]))
        sync(device)
        t2 = time.perf_counter()
        for start in range(0, M, per_batch):
            generate(prompts[start : start + per_batch])
        sync(device)
        apply_s += t2 - t1
        gen_s += time.perf_counter() - t2
        done += 1
    pert.restore()
    full_pf = time.perf_counter() - t0
    out["full_prefetch"] = {
        "seconds": full_pf,
        "specialists": done,
        "specialists_per_hour": done * 3600 / full_pf,
        "apply_s_per_specialist": apply_s / max(done, 1),
        "generate_s_per_specialist": gen_s / max(done, 1),
        "peak_gpu_gib": peak_gib(device),
    }
    print(
        f"full-rank, in place + prefetched noise: {done} specialists in {full_pf:.2f} s "
        f"({done * 3600 / full_pf:.0f} specialists/h; apply {apply_s / max(done, 1):.2f} s each)",
        flush=True,
    )
    p = out["plain"]["specialists_per_hour"]
    out["ratio_full_prefetch_over_plain"] = out["full_prefetch"]["specialists_per_hour"] / p
    out["ratio_full_prefetch_over_full_alone"] = out["full_prefetch"]["specialists_per_hour"] / max(
        out["full_alone"]["specialists_per_hour"], 1e-9
    )
    out["ratio_lowrank_batched_over_plain"] = out["lowrank_batched"]["specialists_per_hour"] / p
    out["ratio_full_alone_over_plain"] = out["full_alone"]["specialists_per_hour"] / p
    out["ratio_lowrank_batched_over_full_alone"] = out["lowrank_batched"]["specialists_per_hour"] / max(
        out["full_alone"]["specialists_per_hour"], 1e-9
    )
    print(
        f"ratios of plain batched generation: batched low-rank {out['ratio_lowrank_batched_over_plain']:.3f}, "
        f"full-rank one at a time {out['ratio_full_alone_over_plain']:.3f}; low-rank / full-rank "
        f"{out['ratio_lowrank_batched_over_full_alone']:.1f}x",
        flush=True,
    )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "results.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
