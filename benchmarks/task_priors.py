"""Label priors of task splits (issue 39: a bench task whose majority answer scores <= 0.1).

For each task spec: the most common gold answer, its share, the number of distinct answers and
the accuracy of always giving it (the task's own check; corp.evaluate.tasks.label_prior) on
  - the first N of split seed 0's test split of the task (what `corp eval --task SPEC --n-test N`
    scores; for a spec with heldout= that is its held-out test pool),
  - its development pool and its test split (split seed and size given), when it has heldout=,
  - its whole selection pool.

    python benchmarks/task_priors.py --n 100 --split-seed 3 --n-test 600 arith "arith:pool=6000,heldout=4000,dev=400"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corp.evaluate.tasks import SplitSizes, get_task, label_prior, make_splits


def line(what: str, p: dict) -> str:
    lo, hi = p["interval"]
    return (
        f"  {what:<34} n {p['n']:>5}  distinct {p['distinct']:>5}  majority {p['majority_answer'][:24]!r:<26} "
        f"share {p['majority_share']:.3f}  accuracy {p['majority_accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--n", type=int, default=100, help="examples of split seed 0's test split (corp eval's)")
    ap.add_argument("--split-seed", type=int, default=3)
    ap.add_argument("--n-test", type=int, default=600)
    args = ap.parse_args()
    for spec in args.specs:
        task = get_task(spec)
        pools = task.pools()
        print(spec)
        print(
            line(
                f"split seed 0, test, first {args.n}",
                label_prior(task, make_splits(task, SplitSizes(0, 0, 0, args.n), 0)["test"]),
            )
        )
        if "dev" in pools:
            print(line("development pool", label_prior(task, pools["dev"])))
            test = make_splits(task, SplitSizes(0, 0, 0, args.n_test), args.split_seed)["test"]
            print(line(f"test, split seed {args.split_seed}, {args.n_test}", label_prior(task, test)))
        print(line("selection pool", label_prior(task, pools["train"])))


if __name__ == "__main__":
    main()
