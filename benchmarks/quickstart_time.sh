#!/usr/bin/env bash
# The quick start as a new user meets it, timed (issue 56: `make run` in at most 5 minutes after set-up,
# median of 3, on 2 idle cores): a fresh clone of this repository's HEAD in a temporary directory, `make
# setup` once (not timed: the quick start's first command does it before its run), then `make run` N times,
# each from an empty runs/ (a second run in the same directory would resume from the first's rows and
# measure nothing). Prints each wall time, the median, and the last run's table.
#
#   benchmarks/quickstart_time.sh [N=3] [MAKE_RUN_ARGS...]
# QUICKSTART_KEEP=DIR copies the last run's directory (runs/<run>) to DIR before the clone is removed.
# The machine should be idle: say what else ran beside it when you quote the figure.
set -euo pipefail
n=${1:-3}
shift || true
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/corp"
cd "$work/corp"
echo "clone of $(git rev-parse --short HEAD) in $work/corp; load before set-up: $(cut -d' ' -f1-3 /proc/loadavg)"
make setup >"$work/setup.log" 2>&1 || { tail -20 "$work/setup.log"; exit 1; }
times=()
for i in $(seq 1 "$n"); do
  rm -rf runs
  start=$(date +%s.%N)
  make run "$@" >"$work/run-$i.log" 2>&1 || { tail -20 "$work/run-$i.log"; exit 1; }
  t=$(echo "$(date +%s.%N) - $start" | bc)
  times+=("$t")
  echo "make run $i: ${t} s (load after: $(cut -d' ' -f1-3 /proc/loadavg))"
done
if [ -n "${QUICKSTART_KEEP:-}" ]; then cp -r runs/* "$QUICKSTART_KEEP"/; fi
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "median of %d: %.1f s (%.2f min)\n", NR, m, m/60}'
grep -v "^\s*$" "$work/run-$n.log" | grep -iE "base|randopt|corp|gate|CI" | tail -12
