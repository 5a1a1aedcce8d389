"""Apply + restore of a low-rank specialist as a share of its scoring time (issue 26), both paths
side by side in one process.

- `materialised`: one specialist at a time, as `corp score` does on backends without the factored
  pass (and as `corp apply` rebuilds a recipe): apply W0 + sigma E (dense E built element by
  element from the factors), generate the M prompts, restore W0. Share = (apply + restore) /
  generation.
- `factored`: the hf scorer's path under `--noise lowrank:r=R`
  (`corp.runtime.backends.batched_lowrank.population_generations`): nothing is applied or
  restored; what a specialist costs outside generation is drawing its factors and installing them
  in the hooks (`set_group`: stacking a group's factors). Share = (draw + install) / its share of
  the group's generation time. Run with `--batch M` (one specialist per `generate`, like for like
  with the materialised path) and with a larger `--batch` (several specialists per `generate`).

Wall and CPU seconds (time.process_time) are both recorded; on a shared machine CPU seconds are the
stabler figure, and the shares are ratios measured within one process minutes apart.

    python benchmarks/lowrank_specialist_share.py --specialists 4 --prompts 16 --batches 16,64 --threads 1 \\
        --out results/lowrank-population/specialist-share
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
    ap.add_argument("--specialists", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--batches", default="16,64", help="rows per generate of the factored runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from corp.runtime.backends.batched_lowrank import FactoredPopulation, population_generations
    from corp.runtime.backends.hf import HFBackend
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits
    from corp.runtime.models import load_model
    from corp.algorithms.perturb import Direction, specialist_seeds
    from corp.algorithms.perturb.lowrank_noise import lowrank_scheme

    model, tok, model_id, _ = load_model(args.model, device="cpu", dtype="float32")
    task = get_task(args.task)
    prompts = [e.prompt for e in make_splits(task, SplitSizes(args.prompts, 0, 0, 0), 0)["support"]]
    max_new, stop = task.max_new_tokens, task.stop or None
    scheme = lowrank_scheme(args.rank)
    specs = [(s, args.sigma) for s in specialist_seeds(0, args.specialists)]
    b = HFBackend(model, tok, batch_size=len(prompts), scheme=scheme)
    out = {"model": model_id, "S": len(specs), "M": len(prompts), "rank": args.rank, "threads": args.threads}
    out["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    b.generate(prompts[:4], max_new, stop=stop)  # warm-up

    def clock():
        return time.perf_counter(), time.process_time()

    def since(t):
        return time.perf_counter() - t[0], time.process_time() - t[1]

    mat = []
    answers = {}
    for seed, sigma in specs:
        t = clock()
        b.set_direction(Direction.single(seed, sigma))
        apply = since(t)
        t = clock()
        g = b.generate(prompts, max_new, stop=stop)
        gen = since(t)
        t = clock()
        b.set_direction(None)
        restore = since(t)
        answers[seed] = g.texts
        mat.append({"seed": seed, "apply": apply, "restore": restore, "generate": gen})
        print(json.dumps({"materialised": mat[-1]}), flush=True)

    def share(rows, parts):
        return {
            unit: statistics.median(sum(r[p][k] for p in parts) / r["generate"][k] for r in rows)
            for k, unit in ((0, "wall"), (1, "cpu"))
        }

    out["materialised"] = {"rows": mat, "share_apply_restore": share(mat, ("apply", "restore"))}
    out["factored"] = {}
    for batch in [int(x) for x in args.batches.split(",")]:
        b.batch_size = batch
        fp = FactoredPopulation(b.model, b.perturber.params, scheme)
        spent = {"draw": [0.0, 0.0], "install": [0.0, 0.0]}

        def timed(fn, what, spent=spent):
            def call(*args_, **kwargs_):
                t = clock()
                r = fn(*args_, **kwargs_)
                w, c = since(t)
                spent[what][0] += w
                spent[what][1] += c
                return r

            return call

        fp.draw, fp.set_group = timed(fp.draw, "draw"), timed(fp.set_group, "install")
        agree = 0
        t = clock()
        for i, g, _ in population_generations(b, fp, specs, prompts, max_new, stop):
            agree += sum(a == c for a, c in zip(g.texts, answers[specs[i][0]]))
        total = since(t)
        n = len(specs)
        extra = [spent["draw"][k] + spent["install"][k] for k in (0, 1)]
        gen = [total[k] - extra[k] for k in (0, 1)]  # everything else in the pass is generation
        out["factored"][str(batch)] = {
            "specialists_per_generate": max(1, batch // len(prompts)),
            "draw_s_per_specialist": spent["draw"][0] / n,
            "draw_cpu_s_per_specialist": spent["draw"][1] / n,
            "install_s_per_specialist": spent["install"][0] / n,
            "install_cpu_s_per_specialist": spent["install"][1] / n,
            "generation_s_per_specialist": gen[0] / n,
            "generation_cpu_s_per_specialist": gen[1] / n,
            "share_draw_install": {"wall": extra[0] / gen[0], "cpu": extra[1] / gen[1]},
            "same_answers_as_materialised": agree,
            "of": n * len(prompts),
        }
        print(json.dumps({"factored_batch": batch, **out["factored"][str(batch)]}), flush=True)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps({"materialised_share": out["materialised"]["share_apply_restore"]}), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "results.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
