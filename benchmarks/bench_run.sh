#!/usr/bin/env bash
# A long bench run that survives interruptions and leaves its progress in git (issue 22: "commit
# finished cells as they complete, so that a later session resumes from what is committed").
#
#   benchmarks/bench_run.sh CONFIG TASK [TRIES]
#   e.g. benchmarks/bench_run.sh configs/bench-cpu-2.yaml arith &
#        benchmarks/bench_run.sh configs/bench-cpu-2.yaml letters &
#
# Runs `corp bench --config CONFIG --threads N --task TASK` (N: BENCH_THREADS, default 1; TASK: a task's label or spec) in a
# retry loop (up to TRIES starts, default 20; a bad-input exit, status 2, is not retried: the same
# config would fail the same way, and so is a cell that needs more memory than the machine has in all;
# too little memory now, status 75 from corp's memory check, is retried
# after BENCH_MEMORY_WAIT seconds, default 600, and not counted as a barren start). While it runs, and after each start, every new or changed cell
# record of that task (RESULTS_DIR/NAME/cells/SLUG__*.json, finished cells only: corp writes a
# record atomically once its cell is done) is committed, alone, with a message naming the cells;
# when the bench finishes, its outputs (table.md, results.csv, tuning.csv, bench.json, plots) are
# committed too. So are this task's population runs (the `corp score` directories
# WORK_DIR/NAME/TASK__population__*, default WORK_DIR runs/bench: the scored rows, meta, splits and
# report, a few hundred KB each), finished or interrupted (corp score resumes those), copied to
# RESULTS_DIR/NAME/populations/ when no corp process holds them; each start first copies every
# committed one back into WORK_DIR where there is no directory of that name (a directory that is
# there is never overwritten), and the bench reuses it as it reuses its own. The task's shared evaluation cache
# (WORK_DIR/NAME/TASK__shared_evals.jsonl, keyed rows: a cell's top-1 and vote test passes among them) is kept and
# restored the same way, beside the populations. Nothing else is added:
# the other run directories (models, training runs; git-ignored, large) stay uncommitted, so a later
# session resumes from the committed records (finished cells are never rerun) and populations, and
# recomputes only the unfinished cells.
# Several wrappers may share a checkout, one per task or more than one on a task (corp bench
# claims each cell, so two processes never run the same one): commits are serialised by a lock in .git.
#
# Environment: PYTHON (the interpreter that imports corp, default python), CORP_CMD (default:
# "$PYTHON -m corp.cli"), BENCH_METHODS (passed as `--methods`: split one task's methods over
# wrappers, whole noise schemes per wrapper, e.g. configs/bench-noise.yaml), BENCH_POLL seconds between commits while
# running (default 120), BENCH_RETRY_WAIT seconds before a restart (default 60), BENCH_THREADS (default 1;
# 2 for a model too large for two processes at once: the size claim's 1.5B cells), BENCH_BARREN
# (default 3): stop after that many starts in a row that failed and committed nothing (no cell,
# retention record or population run): a failure that repeats the same way would otherwise burn
# every remaining start. BENCH_SNAPSHOT (default 1800): seconds between commits of the rows so far of a population
# run the bench is scoring (a 1.5B population takes hours; a machine that stops without warning loses at most this).
# The results directory must be inside the checkout (the default results/NAME is).
#
# Stopping: SIGTERM (kill PID) stops the bench at once and commits what finished (the running cell is
# lost, its population run kept); SIGUSR1 (kill -USR1 PID) lets the cell its bench is running finish,
# commits it, then stops the bench (the cell it had just begun is lost) and exits 0: the way to end a
# session without losing a cell that was most of the way through. Either way a later start resumes.
# The running cell is the one whose claim (WORK_DIR/NAME/claims/*.lock, an flock) the bench holds
# open, read from /proc (Linux): another wrapper's cell finishing on the same task does not stop this
# one; with no claim held (between cells, or no /proc) it stops at once.
set -u
# glibc gives each thread that allocates its own malloc arena and rarely returns their freed memory
# to the system; vLLM and torch allocate from many threads. Two arenas: a bench-cpu-3 GRPO cell
# peaked at 20.7 GB with the default (seed 0) and 13.95 GB with 2 (seed 1), not a controlled
# comparison; most of the growth was vLLM keeping every finished engine's layers, fixed in corp
# (results/engine-release/README.md). Set it to change it.
export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-2}

if [ $# -lt 2 ]; then
  echo "usage: benchmarks/bench_run.sh CONFIG TASK [TRIES]" >&2
  exit 2
fi
CONFIG=$1
TASK=$2
TRIES=${3:-20}
PY=${PYTHON:-python}
CORP_CMD=${CORP_CMD:-$PY -m corp.cli}
POLL=${BENCH_POLL:-120}
RETRY_WAIT=${BENCH_RETRY_WAIT:-60}
MEMORY_WAIT=${BENCH_MEMORY_WAIT:-600}  # after corp's memory check refused a cell (status 75): not counted as barren
THREADS=${BENCH_THREADS:-1}
BARREN=${BENCH_BARREN:-3}
SNAPSHOT=${BENCH_SNAPSHOT:-1800}
COMMITTED=0  # commits this wrapper made: a start that moved it made progress
DRAIN=       # set by SIGUSR1: the claims the bench held then (the cells it was computing), or "none"
METHODS=()
[ -n "${BENCH_METHODS:-}" ] && METHODS=(--methods "$BENCH_METHODS")

cd "$(git rev-parse --show-toplevel)" || { echo "bench_run.sh: run it inside the corp git checkout" >&2; exit 2; }
# the bench's results directory and the file-name prefix of this task's records, as corp computes them
read -r OUT SLUG WORK TSLUG < <("$PY" - "$CONFIG" "$TASK" <<'EOF'
import sys
from corp.bench.config import file_slug, results_path
from corp.bench.sweep import load_bench_config
cfg = load_bench_config(sys.argv[1])
by_label = {cfg.label(t): t for t in cfg.tasks}
task = by_label.get(sys.argv[2], sys.argv[2])
if task not in cfg.tasks:
    sys.exit(f"bench_run.sh: task {sys.argv[2]!r} is not a task of {cfg.name}; its tasks (labels): {', '.join(by_label)}")
# record names start with the task's label, population run directories with the task's own slug
print(results_path(cfg), file_slug(cfg.label(task)), f"{cfg.work_dir}/{cfg.name}", file_slug(task))
EOF
) || exit 2
[ -n "${OUT:-}" ] || exit 2
LOCK="$(git rev-parse --git-dir)/bench_run.lock"

commit_paths() {  # commit_paths MESSAGE PATH...: add and commit exactly these paths (nothing else staged is taken)
  local msg=$1
  shift
  [ $# -gt 0 ] || return 0
  (
    flock 9
    git add -- "$@" && git commit -q -m "$msg" -- "$@" && echo "bench_run.sh: committed $# file(s): $msg"
  ) 9>"$LOCK" && COMMITTED=$((COMMITTED + 1))
}

changed_paths() {  # changed_paths DIR PREFIX: new or changed files under DIR whose path has DIR/PREFIX in it
  git status --porcelain --untracked-files=all -- "$1" | sed 's/^...//' | grep -F "/$(basename "$1")/$2"
}

commit_cells() {
  local files=()
  local f
  [ -d "$OUT/cells" ] || return 0  # nothing finished yet
  while IFS= read -r f; do
    files+=("$f")
  done < <(changed_paths "$OUT/cells" "${SLUG}__" | grep '\.json$')
  # their off-task retention records (retention: true), scored right after each final cell
  if [ -d "$OUT/retention" ]; then
    while IFS= read -r f; do
      files+=("$f")
    done < <(changed_paths "$OUT/retention" "${SLUG}__" | grep '\.json$')
  fi
  [ ${#files[@]} -gt 0 ] || return 0
  local names reg=()
  names=$(for f in "${files[@]}"; do [[ $f == */retention/* ]] && continue; basename "$f" .json | sed "s/^${SLUG}__//; s/__[0-9a-f]*$//"; done | paste -sd ';' - | sed 's/;/; /g')
  # the pre-registration (corp.bench.protocol) goes with the first cells: a later session's run compares against it
  f="$OUT/preregistration.json"
  [ -f "$f" ] && [ -n "$(git status --porcelain -- "$f")" ] && reg=("$f")
  local cells=0 scored=0 msg
  for f in "${files[@]}"; do if [[ $f == */retention/* ]]; then scored=$((scored + 1)); else cells=$((cells + 1)); fi; done
  msg="bench $(basename "$OUT") ($TASK):"
  [ "$cells" -gt 0 ] && msg="$msg $cells finished cell(s): $names"
  [ "$scored" -gt 0 ] && msg="$msg$([ "$cells" -gt 0 ] && echo ";") retention of $scored finished cell(s)"
  commit_paths "$msg" "${files[@]}" ${reg[@]+"${reg[@]}"}
}

held_claims() {  # the claim files the bench process has open (the cells it is computing), one per line
  local f
  [ -n "$pid" ] || return 0
  for f in /proc/"$pid"/fd/*; do
    readlink "$f" 2>/dev/null
  done | grep -F "/claims/" | sort -u
}

copy_run() {  # copy_run DIR/: a population run's files (not its lock) into RESULTS_DIR/NAME/populations/
  local f dest="$OUT/populations/$(basename "$1")"
  mkdir -p "$dest" || return 1
  for f in "$1"*; do
    [ -f "$f" ] && cp -p "$f" "$dest/"
  done
  # corp removes a run's FAILED once a rerun completes it: the copy loses it too (a complete population of
  # the size claim was committed with the FAILED of its first, interrupted start beside its "complete" status)
  [ -e "${1%/}/FAILED" ] || rm -f "$dest/FAILED"
  return 0
}

commit_kept() {  # commit_kept WHAT: the shared evaluations copied, then every new or changed file of this task under populations/
  local f files=()
  save_evals
  [ -d "$OUT/populations" ] || return 0
  while IFS= read -r f; do
    files+=("$f")
  done < <(changed_paths "$OUT/populations" "${TSLUG}__")
  [ ${#files[@]} -gt 0 ] || return 0
  commit_paths "bench $(basename "$OUT") ($TASK): $1" "${files[@]}"
}

save_populations() {  # copy each finished or interrupted population run of this task that no process holds, and commit the copies
  local d name
  for d in "$WORK/${TSLUG}"__population__*/; do
    [ -d "$d" ] || continue
    name=$(basename "$d")
    if [ -n "$(find "$d" -maxdepth 1 -type f -size +2M)" ]; then
      echo "bench_run.sh: population run $name has a file over 2 MB; not committed (a later session rescores it)" >&2
      continue
    fi
    (
      flock -n 8 || exit 1  # a corp process has it open (scoring, or growing its prefix): next time
      # complete, or interrupted (its rows are saved and `corp score` resumes it); never a failed run
      grep -Eq '"status": *"(complete|interrupted)"' "$d/run_status.json" 2>/dev/null || exit 1
      copy_run "$d" || exit 1
      exit 0
    ) 8>>"$d/.corp.lock" || continue
  done
  commit_kept "population run(s), kept so a later session does not rescore them"
}

save_evals() {  # copy this task's shared evaluation cache (WORK_DIR/NAME/TASK__shared_evals.jsonl: greedy base and
  # specialist evaluations, each row keyed by everything that defines it) beside the populations; the caller commits it.
  # A cell's test passes of its top-1 and vote members land there as they finish, so a cell cut off by a stopped
  # machine redoes only what is not in it. Copied while a process may be appending: a torn last row is dropped on reading.
  local f="$WORK/${TSLUG}__shared_evals.jsonl"
  [ -f "$f" ] || return 0
  if [ "$(stat -c %s "$f")" -gt 2000000 ]; then
    echo "bench_run.sh: $(basename "$f") is over 2 MB; not committed (a later session recomputes its rows)" >&2
    return 0
  fi
  mkdir -p "$OUT/populations" && cp -p "$f" "$OUT/populations/"
}

snapshot_populations() {  # the rows so far of each population run of this task that a corp process is scoring, committed
  # (every BENCH_SNAPSHOT s): a machine that stops without warning, with no signal to the wrapper, loses at most that
  # much scoring. The copy is what such a stop leaves in WORK_DIR (status "running", perhaps a torn last row, which
  # corp drops on reading), and `corp score` resumes it the same way; save_populations replaces it once the run ends.
  local d
  for d in "$WORK/${TSLUG}"__population__*/; do
    [ -d "$d" ] || continue
    ( flock -n 8 ) 8>>"$d/.corp.lock" && continue  # nobody holds it: save_populations' to copy, finished or not
    [ -n "$(find "$d" -maxdepth 1 -type f -size +2M)" ] && continue  # save_populations says so once it ends
    copy_run "$d" || continue
  done
  commit_kept "population run(s) and evaluations so far, while scoring (a later session resumes them)"
}

restore_populations() {  # committed population runs back into WORK_DIR, where it has no directory of that name
  local d name
  for d in "$OUT/populations/${TSLUG}"__population__*/; do
    [ -d "$d" ] || continue
    name=$(basename "$d")
    [ -e "$WORK/$name" ] && continue
    mkdir -p "$WORK" && cp -rp "$d" "$WORK/$name" && echo "bench_run.sh: restored population run $name"
  done
  local f="$OUT/populations/${TSLUG}__shared_evals.jsonl"
  if [ -f "$f" ] && [ ! -e "$WORK/$(basename "$f")" ]; then
    mkdir -p "$WORK" && cp -p "$f" "$WORK/" && echo "bench_run.sh: restored the shared evaluations $(basename "$f")"
  fi
}

commit_outputs() {
  local files=() f
  for f in "$OUT"/table.md "$OUT"/results.csv "$OUT"/tuning.csv "$OUT"/bench.json "$OUT"/*.png; do
    [ -f "$f" ] && [ -n "$(git status --porcelain -- "$f")" ] && files+=("$f")
  done
  commit_paths "bench $(basename "$OUT"): outputs after task $TASK finished" "${files[@]}"
}

pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait; commit_cells; save_populations; exit 143' TERM INT  # stopping the wrapper stops its bench
trap 'DRAIN=$(held_claims); DRAIN=${DRAIN:-none}; echo "bench_run.sh: SIGUSR1: stopping once the running cell finishes and is committed"' USR1

drained() {  # stop the bench, keep what finished, exit 0 (SIGUSR1's stop)
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  wait
  commit_cells
  save_populations
  echo "bench_run.sh: stopped on SIGUSR1 once the cell it was running had finished; start it again to resume"
  exit 0
}
restore_populations
try=0
barren=0
while [ "$try" -lt "$TRIES" ]; do
  [ -n "$DRAIN" ] && drained  # SIGUSR1 came between starts
  try=$((try + 1))
  before=$COMMITTED
  echo "bench_run.sh: start $try of $TRIES: $CORP_CMD bench --config $CONFIG --threads $THREADS --task $TASK ${METHODS[*]}"
  # shellcheck disable=SC2086  # CORP_CMD is a command line
  $CORP_CMD bench --config "$CONFIG" --threads "$THREADS" --task "$TASK" "${METHODS[@]}" &
  pid=$!
  waited=0
  ticks=0
  since_snapshot=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    since_snapshot=$((since_snapshot + 1))
    if [ "$since_snapshot" -ge "$SNAPSHOT" ]; then
      snapshot_populations
      since_snapshot=0
    fi
    if [ -n "$DRAIN" ]; then  # draining: read the bench's held claims every 5 s
      ticks=$((ticks + 1))
      # stop once the bench holds none of the claims it held when the signal came (those cells are done)
      [ $((ticks % 5)) -eq 0 ] && ! held_claims | grep -qxF -e "${DRAIN}" && drained
    fi
    if [ "$waited" -ge "$POLL" ]; then
      commit_cells
      save_populations
      waited=0
    fi
  done
  wait "$pid"
  rc=$?
  commit_cells
  save_populations
  if [ "$rc" -eq 0 ]; then
    commit_outputs
    echo "bench_run.sh: task $TASK finished"
    exit 0
  fi
  if [ "$rc" -eq 2 ]; then
    echo "bench_run.sh: corp bench refused its input (status 2); not retrying" >&2
    exit 2
  fi
  if [ "$rc" -eq 75 ]; then  # too little memory now (corp's memory check): what runs beside it may end
    echo "bench_run.sh: too little memory for the next cell now (status 75); retrying in ${MEMORY_WAIT}s (finished cells are kept)" >&2
    sleep "$MEMORY_WAIT"
    continue
  fi
  [ -n "$DRAIN" ] && drained  # the bench stopped while draining: do not restart it
  if [ "$COMMITTED" -eq "$before" ]; then barren=$((barren + 1)); else barren=0; fi
  if [ "$barren" -ge "$BARREN" ]; then
    echo "bench_run.sh: $barren starts in a row stopped with status $rc and finished nothing; the same failure would repeat: read the error above, fix it, and start the wrapper again (finished cells are kept)" >&2
    exit 1
  fi
  echo "bench_run.sh: corp bench stopped with status $rc; restarting in ${RETRY_WAIT}s (finished cells are kept)" >&2
  sleep "$RETRY_WAIT"
done
echo "bench_run.sh: gave up after $TRIES starts" >&2
exit 1
