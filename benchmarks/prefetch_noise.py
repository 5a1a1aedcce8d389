"""What drawing the next specialist's noise while the current one generates saves (issue 36).

Side by side in one run, on the hf backend: specialists scored one after another as the local
executor scores them (`score_one`: set the direction, generate on M prompts), with prefetch on
(the next specialist's W0 + sigma eps built on background threads while this one generates) and
off (`CORP_PREFETCH=0`: built inside set_direction, while nothing generates). The two modes
alternate in blocks (on, off, off, on, ...), so drift in the machine's load hits both alike.
Reported: median seconds per specialist of each, their ratio, the median apply time of each (what
set_direction costs the caller), and the noise draw rate (parameters per second of a warm apply
without prefetch), from which the draw of a 1.5B specialist on a 16-core GPU host is estimated on
paper (stated as an estimate, with its assumptions). On a CPU the background draw competes with
generation for the same cores, which is why the hf backend prefetches only when its model is on a
GPU (CORP_PREFETCH=1 forces it on, 0 off; this script sets it per mode).

    python benchmarks/prefetch_noise.py --out results/prefetch-noise
    python benchmarks/prefetch_noise.py --tiny          # a tiny random model: checks the script only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import corp  # noqa: E402,F401  before torch (corp's OpenMP defaults)
import torch  # noqa: E402

from corp.runtime.backends.hf import HFBackend  # noqa: E402
from corp.evaluate.tasks import SplitSizes, get_task, make_splits  # noqa: E402
from corp.algorithms.perturb import Direction, specialist_seeds  # noqa: E402


def tiny_backend() -> HFBackend:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import make_char_tokenizer, make_tiny_llama

    tok = make_char_tokenizer()
    return HFBackend(make_tiny_llama(tok, hidden=64), tok, batch_size=64)


def score(backend: HFBackend, specs: list[Direction], prompts: list[str], max_new: int, prefetch: bool):
    """Per specialist: (wall seconds of set_direction + generate, seconds in set_direction)."""
    os.environ["CORP_PREFETCH"] = "1" if prefetch else "0"
    out = []
    for i, d in enumerate(specs):
        t0 = time.perf_counter()
        backend.set_direction(d)
        applied = time.perf_counter() - t0
        if i + 1 < len(specs):
            backend.prefetch(specs[i + 1])
        backend.generate(prompts, max_new)
        out.append((time.perf_counter() - t0, applied))
    backend.set_direction(None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per specialist (arith)")
    ap.add_argument("--specialists", type=int, default=4, help="specialists per block")
    ap.add_argument("--blocks", type=int, default=6, help="blocks, alternating on/off (even)")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--tiny", action="store_true", help="a tiny random model: checks the script, measures nothing")
    ap.add_argument("--out", default=None, help="directory for result.json")
    a = ap.parse_args()

    backend = tiny_backend() if a.tiny else HFBackend.from_model_name(a.model, batch_size=64)
    task = get_task("arith")
    prompts = [e.prompt for e in make_splits(task, SplitSizes(a.prompts, 0, 0, 0), 0)["support"]]
    max_new = a.max_new_tokens or task.max_new_tokens
    seeds = specialist_seeds(7, a.specialists * a.blocks + 1)
    n_sel = backend.perturber.n_selected

    # draw rate: one specialist's W0 + sigma eps, nothing else running
    t0 = time.perf_counter()
    backend.set_direction(Direction.single(seeds[-1], 1e-3))
    draw_s = time.perf_counter() - t0
    backend.set_direction(None)
    backend.generate(prompts[:4], 4)  # warm-up

    walls = {True: [], False: []}
    applies = {True: [], False: []}
    order = [(b // 2 + b) % 2 == 0 for b in range(a.blocks)]  # on, off, off, on, on, off, ...
    for b, on in enumerate(order):
        specs = [Direction.single(s, 1e-3) for s in seeds[b * a.specialists : (b + 1) * a.specialists]]
        for wall, applied in score(backend, specs, prompts, max_new, on):
            walls[on].append(wall)
            applies[on].append(applied)
    med = {on: statistics.median(walls[on]) for on in walls}
    med_apply = {on: statistics.median(applies[on]) for on in applies}
    # the draw rate: a warm apply without prefetch (draw + add + copy, nothing else running)
    rate = n_sel / med_apply[False]
    # On paper: a 1.5B specialist's draw at this machine's per-core rate on 16 cores (one tensor per
    # core: corp draws tensors on parallel workers), against its generation on an H200.
    threads = torch.get_num_threads()
    per_core = rate / max(1, threads)
    draw_15b_16 = 1.54e9 / (per_core * 16)
    result = {
        "model": a.model or ("tiny" if a.tiny else "smollm2-135m (embedded)"),
        "selected_parameters": n_sel,
        "prompts": a.prompts,
        "max_new_tokens": max_new,
        "specialists_per_mode": len(walls[True]),
        "torch_threads": threads,
        "cpu": platform.processor() or platform.machine(),
        "median_specialist_s": {"prefetch": med[True], "no_prefetch": med[False]},
        "ratio_prefetch_over_no_prefetch": med[True] / med[False],
        "median_apply_s": {"prefetch": med_apply[True], "no_prefetch": med_apply[False]},
        "draw_s_one_specialist": draw_s,
        "draw_rate_params_per_s": rate,
        "estimate_1p5b_draw_s_on_16_cores": draw_15b_16,
        "estimate_note": (
            "on paper: this machine's per-core draw rate times 16 cores, for 1.54e9 parameters; prefetch hides "
            "min(1, generation seconds / draw seconds) of it when the host has cores to spare beside the GPU"
        ),
    }
    print(json.dumps(result, indent=2))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "result.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
