"""corp eval vs lm-evaluation-harness on one corp model: the same test examples, the same prompt text.

    python benchmarks/lm_eval_compare.py --model DIR --task arith --n-test 128 --out results/lm-eval-compare

1. `corp eval --model DIR --task T --n-test N` (the real command) scores greedy accuracy
   on corp's test split and records per-example outcomes (test_outcomes.json).
2. The same test examples are written as JSONL, each with the exact text corp's hf backend feeds
   the model (the chat template applied, as `corp.runtime.backends.hf.format_prompt` does), and a
   custom lm-evaluation-harness task (YAML, `generate_until`, greedy, corp's token limit and stop
   strings, the last number of the completion against the gold answer: corp's rule for
   arith-like tasks) reads them.
3. `lm_eval.simple_evaluate` runs that task on the same directory with the `hf` model; per-example
   outcomes are compared with corp's (agreement, accuracy of each, discordant examples).

Needs `pip install lm-eval` (0.4.13 was checked to leave torch and transformers alone).
Writes OUT/compare.json, OUT/README.md, and the task files under OUT/task/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{text}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: {until}
  do_sample: false
  temperature: 0.0
  max_gen_toks: {max_new}
filter_list:
  - name: last-number
    filter:
      - function: regex
        regex_pattern: "(-?[0-9][0-9,]*(?:\\\\.[0-9]+)?)"
        group_select: -1
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a model directory (e.g. one `corp apply` wrote)")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--n-test", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default="results/lm-eval-compare")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    (out / "task").mkdir(parents=True, exist_ok=True)
    model = str(Path(args.model).resolve())
    env = {**os.environ, "CORP_NO_PROGRESS": "1"}

    # 1. corp eval, the real command
    run_dir = out / "corp-eval-run"
    cmd = [
        sys.executable,
        "-m",
        "corp.cli",
        "eval",
        "--model",
        model,
        "--task",
        args.task,
        "--n-test",
        str(args.n_test),
        "--batch-size",
        str(args.batch_size),
        "--output-dir",
        str(run_dir),
    ]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    corp_s = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"corp eval failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    outcomes = json.loads((run_dir / "test_outcomes.json").read_text())
    ids = outcomes["example_ids"]
    corp_correct = dict(zip(ids, outcomes["outcomes"]["model"]))

    # 2. the same examples and prompt text, as lm-eval JSONL + task YAML
    from transformers import AutoTokenizer

    from corp.runtime.backends.hf import format_prompt
    from corp.evaluate.tasks import get_task

    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    task = get_task(args.task, cfg.get("data"))
    saved = json.loads((run_dir / "splits.json").read_text())
    test_ids = saved["test"] if isinstance(saved.get("test"), list) else saved["splits"]["test"]
    assert [t if isinstance(t, str) else t["id"] for t in test_ids] == ids, "corp's test ids and its outcomes disagree"
    pool = {e.id: e for pool in task.pools().values() for e in pool}
    tok = AutoTokenizer.from_pretrained(model)
    data = out / "task" / "examples.jsonl"
    with data.open("w") as f:
        for i in ids:
            e = pool[i]
            f.write(json.dumps({"id": i, "text": format_prompt(tok, e.prompt), "answer": e.answer}) + "\n")
    max_new = cfg.get("max_new_tokens") or task.max_new_tokens
    stop = list(getattr(task, "stop", None) or [])
    name = f"corp_{args.task.replace(':', '_')}"
    (out / "task" / f"{name}.yaml").write_text(
        TASK_YAML.format(name=name, data=data, until=json.dumps(stop), max_new=max_new)
    )

    # 3. lm-evaluation-harness on the same directory
    import lm_eval
    from lm_eval.tasks import TaskManager

    t0 = time.perf_counter()
    result = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={model},dtype=float32",
        tasks=[name],
        task_manager=TaskManager(include_path=str(out / "task")),
        batch_size=args.batch_size,
        log_samples=True,
        device="cpu",
    )
    lm_s = time.perf_counter() - t0
    samples = result["samples"][name]
    lm_correct = {s["doc"]["id"]: int(s["exact_match"]) for s in samples}
    both = [i for i in ids if i in lm_correct]
    agree = sum(corp_correct[i] == lm_correct[i] for i in both)
    summary = {
        "model": model,
        "task": args.task,
        "n": len(both),
        "corp_eval_accuracy": sum(corp_correct[i] for i in both) / len(both),
        "lm_eval_accuracy": sum(lm_correct[i] for i in both) / len(both),
        "agreement": agree / len(both),
        "only_corp_correct": [i for i in both if corp_correct[i] and not lm_correct[i]],
        "only_lm_eval_correct": [i for i in both if lm_correct[i] and not corp_correct[i]],
        "lm_eval_version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
        "corp_eval_seconds": round(corp_s, 1),
        "lm_eval_seconds": round(lm_s, 1),
        "corp_command": " ".join(cmd[1:]),
        "max_new_tokens": max_new,
        "stop": stop,
    }
    (out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if not k.startswith("only_")}, indent=2))


if __name__ == "__main__":
    main()
