"""Where one run's time went, per evaluation, from its own rows (issue 54: the headline command at real size).

Reads RUN_DIR/population.jsonl and RUN_DIR/evals.jsonl and writes a markdown table: for each specialist
(and each other evaluation: the base, CoRP's step-search candidates, the gate's and the test rows) the
seconds split into the noise draw, the weight push into the engine, generation and the reward, with the
tokens generated, the decode rate and how many completions used every token they were allowed (the
truncation rate the config's `max_completion_length` is judged by). The noise/push split is recorded by
the vllm backend only (`noise_seconds`, `push_seconds`: the engine's wait for the next built tensor, and
the rest of the reload); on hf the whole `apply_seconds` is the draw and the in-place add.

    python benchmarks/run_costs.py RUN_DIR > results/NAME/costs.md
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from corp.runtime.runs import read_jsonl


def _cells(r: dict) -> list[str]:
    gen = float(r.get("seconds", 0.0))
    toks = int(r.get("generated_tokens", 0))
    noise, push = r.get("noise_seconds"), r.get("push_seconds")
    return [
        str(r.get("kind")),
        str(r.get("split")),
        f"{r['sigma']:g}" if r.get("sigma") is not None else "",
        str(r.get("n_examples")),
        f"{noise:.1f}" if noise is not None else "",
        f"{push:.1f}" if push is not None else "",
        f"{float(r.get('apply_seconds', 0.0)):.1f}",
        f"{gen:.1f}",
        f"{float(r.get('reward_seconds', 0.0)):.2f}",
        str(toks),
        f"{toks / gen:.1f}" if gen > 0 else "",
        str(r.get("truncated", "")),
        f"{r.get('accuracy', 0.0):.3f}",
    ]


HEADER = [
    "kind",
    "split",
    "sigma",
    "n",
    "noise s",
    "push s",
    "apply s",
    "generation s",
    "reward s",
    "tokens",
    "tokens/s",
    "cut off",
    "accuracy",
]


def table(rows: list[dict]) -> list[str]:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return out


def summary(rows: list[dict]) -> list[str]:
    spec = [r for r in rows if r.get("kind") == "specialist"]
    every = [r for r in rows if r.get("n_examples")]
    n = sum(int(r["n_examples"]) for r in every)
    cut = sum(int(r.get("truncated", 0)) for r in every)
    lines = [
        f"- evaluations: {len(every)}; completions: {n}; cut off at the length limit: {cut} ({cut / max(n, 1):.1%})"
    ]
    if spec:

        def med(key: str) -> str:
            vals = [float(r[key]) for r in spec if r.get(key) is not None]
            return f"{statistics.median(vals):.1f} s" if vals else "not recorded"

        total = [
            float(r["seconds"]) + float(r.get("apply_seconds", 0.0)) + float(r.get("reward_seconds", 0.0)) for r in spec
        ]
        lines.append(
            f"- per specialist (median of {len(spec)}): {statistics.median(total):.1f} s in all; noise draw "
            f"{med('noise_seconds')}, weight push {med('push_seconds')}, generation {med('seconds')}, reward "
            f"{med('reward_seconds')}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    args = ap.parse_args()
    rows = []
    for name in ("population.jsonl", "evals.jsonl"):
        path = args.run_dir / name
        if path.is_file():
            rows += read_jsonl(path, key="key")
    if not rows:
        raise SystemExit(f"no rows in {args.run_dir} (population.jsonl, evals.jsonl)")
    print("\n".join(["## Per evaluation", "", *summary(rows), "", *table(rows)]))


if __name__ == "__main__":
    main()
