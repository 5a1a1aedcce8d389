"""Peak memory of the Gram matrix of a population (corp.algorithms.corp_operator.algebra.gram_matrix) with the fp64
chunk bounded by the memory budget (now) and with the fixed 1M-element chunk it had before.

    python benchmarks/gram_memory.py [SPECIALISTS]     # default 200, one 1536 x 576 tensor (SmolLM2's MLP)

Each variant runs in its own process (this script again, `--child`; peak RSS from getrusage), one
thread, the default 2 GB budget; prints the peak of each and the max |difference| of the two G's
relative to the diagonal.
"""

import json
import resource
import subprocess
import sys

import numpy as np


def child(k: int, variant: str, path: str) -> None:
    import torch

    from corp.algorithms.corp_operator import algebra
    from corp.algorithms.perturb.noise import derive_seeds

    torch.set_num_threads(1)
    if variant == "old":
        algebra.fp64_chunk = lambda ri, rj, budget: 1 << 20  # the chunk before the bound
    G = algebra.gram_matrix([("mlp", (1536, 576))], derive_seeds("gram-memory", 0, n=k), progress=False)
    np.save(path, G)
    print(json.dumps({"peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    peak = {}
    for variant in ("old", "new"):
        path = f"/tmp/gram-{variant}.npy"
        res = subprocess.run(
            [sys.executable, __file__, "--child", str(k), variant, path], capture_output=True, text=True
        )
        if res.returncode:
            sys.exit(res.stderr[-2000:])
        peak[variant] = json.loads(res.stdout.strip().splitlines()[-1])["peak_gb"]
    a, b = np.load("/tmp/gram-old.npy"), np.load("/tmp/gram-new.npy")
    rel = float(np.abs(a - b).max() / np.abs(np.diag(a)).max())
    print(
        f"{k} specialists, one 1536 x 576 tensor, 2 GB budget: peak RSS {peak['old']:.2f} GB with 1M-element "
        f"fp64 chunks, {peak['new']:.2f} GB bounded; max |G_old - G_new| / max diag = {rel:.1e}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
