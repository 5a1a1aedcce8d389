#!/usr/bin/env bash
# Same rows before and after the shared loop (issue 38: "iterative methods share one driver"): `corp es`,
# `corp grpo`, `corp fgrpo`, `corp ftis` and `corp fera` on the embedded model, each run twice into one directory (1
# step, then resumed to 2, so the resume path runs too), and `corp fedcorp` once (it has no steps; it ends
# through the same writer), from two checkouts of corp with the same interpreter,
# compared without wall-clock fields: every metrics row (metrics.jsonl, rounds.jsonl), the report's
# rows, comparisons and its method-specific fields, the recipe's components, and the saved model's
# weights (sha256 of model/model.safetensors). Exits 1 if any differs. About 10 minutes on 2 cores.
#   PYTHON=.venv/bin/python benchmarks/loop_check.sh BEFORE_TREE AFTER_TREE OUT [SIDES]
#   (BEFORE_TREE from `git worktree add /tmp/before REV`; SIDES "before after" by default: run one
#   side alone, then both compare, to overlap the runs with other work; RUNS="es grpo fgrpo ftis fera" by
#   default, a subset reruns only those)
set -eu
before=$1; after=$2; out=$3; sides=${4:-before after}
py=${PYTHON:-python}
runs=${RUNS:-es grpo fgrpo ftis fera fedcorp}
# a reward that varies (benchmarks/loop_check_reward.py), so that every method's weights move
reward="$(cd "$(dirname "$0")" && pwd)/loop_check_reward.py:digit_share"
common=(--n-support 8 --n-probe 4 --n-validation 4 --n-test 8 --max-completion-length 12 --seed 3 --threads 1)
for side in $sides; do
  tree=$([ "$side" = before ] && echo "$before" || echo "$after")
  mkdir -p "$out/$side"
  run() { (cd "$out/$side" && CORP_NO_PROGRESS=1 PYTHONPATH="$tree" $py -m corp.cli "$@" "${common[@]}" >>"$out/$side/log" 2>&1); }
  for m in $runs; do
    rm -rf "${out:?}/$side/$m"
    for n in 1 2; do
      case $m in
        es) run es --iterations $n --reward "$reward" --population-per-iteration 4 --sigma 0.05 --learning-rate 0.05 --output-dir "$out/$side/es" ;;
        grpo) run grpo --max-steps $n --reward "$reward" --prompts-per-step 2 --num-generations 2 --lora-r 4 --output-dir "$out/$side/grpo" ;;
        fgrpo) run fgrpo --rounds $n --reward "$reward" --clients 2 --split-by iid --local-steps 1 --prompts-per-step 2 --num-generations 2 \
                 --lora-r 4 --output-dir "$out/$side/fgrpo" ;;
        ftis) run ftis --n-nodes 2 --max-steps $n --prompts-per-step 2 --num-generations 2 --output-dir "$out/$side/ftis" ;;
        fera) run fera --rounds $n --clients 2 --shots 1 --num-generations 2 --output-dir "$out/$side/fera" ;;
        fedcorp) if [ $n = 2 ]; then run fedcorp --reward "$reward" --population 4 --sigmas 0.05 --alphas 1,2 --clients 2 \
                 --split-by iid --gate-z -10 --min-accept 0.5 --output-dir "$out/$side/fedcorp"; fi ;;
      esac
    done
  done
done
[ "$sides" = "before after" ] || [ -d "$out/before" -a -d "$out/after" ] || exit 0
$py - "$out" <<'PY'
import hashlib, json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def clean(x):
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items() if "second" not in k and "time" not in k and k not in ("run_dir", "model_dir", "recipe", "created", "started", "finished")}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x
# report fields the after side may add, each with why (anything else added, removed or changed fails):
# issue 38's shared writer states every recipe's path and size (fedcorp stated its size only, es its path only)
ADDED = {"recipe_bytes", "recipe"}
def rows(p):
    return [clean(json.loads(l)) for l in p.read_text().splitlines() if l.strip()] if p.exists() else None
same = True
for run, log in (("es", "metrics.jsonl"), ("grpo", "metrics.jsonl"), ("fgrpo", "rounds.jsonl"), ("ftis", "metrics.jsonl"), ("fera", "rounds.jsonl"), ("fedcorp", None)):
    if not (out / "before" / run).exists():
        continue
    ok = True
    if log is not None:
        a, b = rows(out / "before" / run / log), rows(out / "after" / run / log)
        ok = a == b and a is not None
        print(f"{run}/{log}: {len(a or [])} rows before, {len(b or [])} after, identical without times: {ok}")
    raw_a, raw_b = (json.loads((out / s / run / "report.json").read_text()) for s in ("before", "after"))
    added = sorted(k for k in set(raw_b) - set(raw_a) if k in ADDED)
    if added:
        print(f"{run}/report.json: fields added after: {', '.join(f'{k}={raw_b[k]!r}' for k in added)}")
    ra, rb = clean(raw_a), clean({k: v for k, v in raw_b.items() if k not in added})
    ok2 = ra == rb
    print(f"{run}/report.json identical without times and paths: {ok2}" + ("" if ok2 else f" (differ: {sorted(k for k in set(ra) | set(rb) if ra.get(k) != rb.get(k))})"))
    ok3 = True
    if (out / "before" / run / "model").exists():  # fera saves none (ftis one per node, compared through its report)
        ha, hb = (hashlib.sha256((out / s / run / "model" / "model.safetensors").read_bytes()).hexdigest() for s in ("before", "after"))
        print(f"{run}/model/model.safetensors sha256 {ha[:16]} before, {hb[:16]} after: {ha == hb}")
        ok3 = ha == hb
    if (out / "before" / run / "recipe.json").exists():
        a, b = (json.loads((out / s / run / "recipe.json").read_text()) for s in ("before", "after"))
        ok3 &= a.get("components") == b.get("components")
        print(f"{run}/recipe.json components identical: {a.get('components') == b.get('components')}")
    same &= ok and ok2 and ok3
# the weights must have moved, or the comparison above proves nothing about training
hashes = {run: hashlib.sha256((out / "after" / run / "model" / "model.safetensors").read_bytes()).hexdigest()
          for run in ("es", "grpo", "fgrpo", "fedcorp") if (out / "after" / run / "model").exists()}
moved = len(set(hashes.values())) == len(hashes)
print(f"the saved models differ from one another (training moved the weights): {moved}")
sys.exit(0 if same and moved else 1)
PY
