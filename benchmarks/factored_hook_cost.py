"""What the factored pass's products cost in generation, by rank (results/step-search/factored).

One process, the same probe prompts, greedy: the base model generating them (`plain`), then with
the hooks of `FactoredPopulation.set_shared` installed for an update of rank k per matrix (random
factors at a tiny scale, so the answers stay the base's and every run generates the same tokens),
alternating plain, k, plain, k', ... The hooks add k (m + n) multiply-adds per token and matrix to
the base's m n: CoRP's step search on a low-rank population has k = K r (K elites, rank r).

    python benchmarks/factored_hook_cost.py --ranks 64,512 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import corp  # noqa: E402,F401  before torch, as the CLI does (corp's OpenMP wait policy)
import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--ranks", default="64,512")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from corp.runtime.backends.batched_lowrank import FactoredPopulation
    from corp.runtime.backends.hf import HFBackend
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits
    from corp.algorithms.perturb.lowrank_noise import lowrank_scheme

    task = get_task(args.task)
    prompts = [e.prompt for e in make_splits(task, SplitSizes(0, args.prompts, 0, 0), 0)["probe"]]
    b = HFBackend.from_model_name(args.model, batch_size=len(prompts), scheme=lowrank_scheme(4))
    fp = FactoredPopulation(b.model, b.perturber.params, b.perturber.scheme)
    per_token = sum(m * n for m, n in fp.shapes.values())
    out = {"model": args.model, "prompts": len(prompts), "threads": args.threads, "runs": []}
    out["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]

    def gen(label, k=None):
        t0, c0 = time.perf_counter(), time.process_time()
        texts = b.generate(prompts, task.max_new_tokens, stop=task.stop or None).texts
        row = {"label": label, "rank": k, "s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
        if k is not None:
            row["hook_macs_over_base_macs"] = k * sum(m + n for m, n in fp.shapes.values()) / per_token
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
        return texts

    b.generate(prompts[:4], 4)  # warm-up
    base = gen("plain")
    gen_ = torch.Generator().manual_seed(0)
    for k in [int(x) for x in args.ranks.split(",")]:
        unit = {
            n: (torch.randn(m, k, generator=gen_), torch.randn(n_, k, generator=gen_))
            for n, (m, n_) in fp.shapes.items()
        }
        with fp.hooks():
            fp.set_shared(unit, [1e-9])
            texts = gen("hooks", k)
        out["runs"][-1]["same_answers_as_plain"] = sum(a == c for a, c in zip(texts, base))
        del unit
        gen("plain")
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "hook-cost.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
