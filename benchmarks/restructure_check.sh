#!/usr/bin/env bash
# Same rows before and after a restructuring (issue 38: "a population and a consolidate run on the
# embedded model give the same rows as before the change"): `corp score` (6 specialists at two noise
# scales) and `corp consolidate --from-run` on it, run from two checkouts of corp with the same
# interpreter, compared without the fields that are wall-clock times or paths: the population rows,
# the consolidate run's evaluation rows, both reports' rows, comparisons and population summary, and
# the recipe's components and weights hash; a text naming its side's output directory is read with the
# directory replaced by OUT. Exits 1 if any differs. About 5 minutes on 2 cores.
#   PYTHON=.venv/bin/python benchmarks/restructure_check.sh BEFORE_TREE AFTER_TREE OUT
#   (e.g. BEFORE_TREE from `git worktree add /tmp/before REV`)
set -eu
before=$1; after=$2; out=$3
py=${PYTHON:-python}
for side in before after; do
  tree=$([ $side = before ] && echo "$before" || echo "$after")
  rm -rf "$out/$side"; mkdir -p "$out/$side"
  (cd "$out/$side" && CORP_NO_PROGRESS=1 PYTHONPATH="$tree" $py -m corp.cli score --population 6 --sigmas 0.001,0.002 \
     --n-support 16 --n-probe 8 --n-validation 8 --n-test 16 --max-completion-length 12 --seed 3 --threads 1 --output-dir "$out/$side/score" >/dev/null)
  (cd "$out/$side" && CORP_NO_PROGRESS=1 PYTHONPATH="$tree" $py -m corp.cli consolidate --from-run "$out/$side/score" --population 6 \
     --n-support 16 --n-probe 8 --n-validation 8 --n-test 16 --max-completion-length 12 --seed 3 --threads 1 --top-k 1,2 --gate-z -10 \
     --output-dir "$out/$side/cons" >/dev/null)
done
$py - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
TIME = {"seconds", "apply_seconds", "reward_seconds", "noise_seconds", "push_seconds", "run_dir", "created", "wall_seconds", "started", "finished", "model_dir", "recipe", "source", "from"}
SIDES = (str(out / "before"), str(out / "after"))
def clean(x):
    if isinstance(x, str):  # a text naming its side's run directory (population.noise_scales: "in --from-run DIR")
        for side in SIDES:
            x = x.replace(side, "OUT")
        return x
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items() if k not in TIME and "second" not in k and "time" not in k}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x
def rows(p):
    return [clean(json.loads(l)) for l in p.read_text().splitlines() if l.strip()]
same = True
for rel in ("score/population.jsonl", "cons/evals.jsonl"):
    a, b = rows(out / "before" / rel), rows(out / "after" / rel)
    ok = a == b
    same &= ok
    print(f"{rel}: {len(a)} rows before, {len(b)} after, identical without times: {ok}")
for rel in ("score/report.json", "cons/report.json"):
    a, b = clean(json.loads((out / "before" / rel).read_text())), clean(json.loads((out / "after" / rel).read_text()))
    ok = a.get("rows") == b.get("rows") and a.get("comparisons") == b.get("comparisons") and a.get("population") == b.get("population")
    same &= ok
    print(f"{rel}: rows, comparisons and population identical: {ok}")
a, b = (json.loads((out / s / "cons" / "recipe.json").read_text()) for s in ("before", "after"))
ok = a.get("components") == b.get("components") and a.get("model_weights_hash") == b.get("model_weights_hash")
same &= ok
print(f"cons/recipe.json: components and weights hash identical: {ok}")
sys.exit(0 if same else 1)
PY
