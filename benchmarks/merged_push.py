"""What a vLLM worker's push of a step-search direction costs with the merged term's M kept on disk
(corp.algorithms.perturb.merged_files) against building it at every push (`Direction.add_to`, as before).

    python benchmarks/merged_push.py [--elites 106] [--blocks 1] [--threads 1] [--alphas 1,2,4,8]

The tensors are `--blocks` transformer blocks of Qwen2.5-1.5B's shapes (hidden 1536, MLP 8960, 2 KV heads of
128; 46.8M elements a block, 28 blocks in the model), built as the worker builds them (every tensor on
`per_tensor`'s workers); the direction is one merged term of `--elites` components, pushed at each alpha
(a step search), then once more at the first (the gate's push). Prints seconds per push for both ways, with
the store's pushes after the first read from the page cache ("warm") and after dropping the file's pages
("cold", read from disk), and checks every push's bits against add_to's.
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from corp.algorithms.perturb.direction import Component, Direction
from corp.algorithms.perturb.workers import ScratchPool, per_tensor
from corp.algorithms.perturb.merged_files import MergedFiles
from corp.algorithms.perturb.noise import derive_seeds


def block_shapes(blocks: int) -> list[tuple[str, torch.Size]]:
    h, mlp, kv = 1536, 8960, 256
    one = {
        "self_attn.q_proj.weight": (h, h),
        "self_attn.q_proj.bias": (h,),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (h, h),
        "mlp.gate_proj.weight": (mlp, h),
        "mlp.up_proj.weight": (mlp, h),
        "mlp.down_proj.weight": (h, mlp),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
    }
    return [(f"model.layers.{b}.{n}", torch.Size(s)) for b in range(blocks) for n, s in one.items()]


def push(direction, shapes, store, scratch):
    """Every tensor of base + direction (base: zeros here; the add is the same work), as the worker does."""

    def one(name, shape, sc):
        acc = torch.zeros(shape, dtype=torch.float32)
        buf = sc.buffer("noise", shape.numel())
        if store is None:
            return name, direction.add_to(acc, name, sc.gen, buf)
        return name, store.add_to(direction, acc, name, sc.gen, buf)

    if store is not None:
        store.prepare(direction)
    t0 = time.perf_counter()
    out = dict(per_tensor(one, shapes, scratch))
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elites", type=int, default=106)
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--alphas", default="1,2,4,8")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = block_shapes(args.blocks)
    numel = sum(s.numel() for _, s in shapes)
    seeds = derive_seeds("merged-push", 0, n=args.elites)
    m = Direction.merged([Component(int(s), 1e-3, 1.0 / args.elites) for s in seeds])
    alphas = [float(a) for a in args.alphas.split(",")]
    order = [*alphas, alphas[0]]  # the step search, then the gate's push of the first
    print(f"{len(shapes)} tensors, {numel / 1e6:.1f}M elements, {args.elites} elites, {args.threads} thread(s)")
    with tempfile.TemporaryDirectory(dir=Path.home() / ".cache") as tmp:
        for cold in (False, True):
            store, scratch = MergedFiles(shapes, directory=Path(tmp)), ScratchPool()
            rows = []
            for i, a in enumerate(order):
                d = m.scaled(a)
                if cold:
                    for path in store.kept():
                        fd = os.open(path, os.O_RDONLY)
                        os.fsync(fd)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                t_store, got = push(d, shapes, store, scratch)
                t_plain, want = push(d, shapes, None, scratch) if i < 2 else (float("nan"), got)
                same = all(torch.equal(got[n], want[n]) for n in want)
                rows.append((a, t_store, t_plain, same))
                print(
                    f"{'cold' if cold else 'warm'} alpha={a:g}: kept on disk {t_store:7.2f} s"
                    + (f", built again {t_plain:7.2f} s, same bits: {same}" if i < 2 else "")
                )
            later = [r[1] for r in rows[1:]]
            print(
                f"{'cold' if cold else 'warm'}: first push {rows[0][1]:.2f} s (builds and writes M), later pushes median "
                f"{statistics.median(later):.2f} s against {rows[1][2]:.2f} s built again: "
                f"{rows[1][2] / statistics.median(later):.0f}x; {numel * 4 / 2**30:.2f} GiB a term on disk"
            )
            store.close()


if __name__ == "__main__":
    main()
