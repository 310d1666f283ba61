#!/usr/bin/env bash
# Compare two commits with bench/suite.py: this checkout (the change) against BASE, one
# round each per pair, alternated, the first of a pair flipped every round (the first of a
# pair tends to be the faster on a shared machine). BASE is checked out as a git worktree in
# a temporary folder and removed at the end; each side's server runs that side's code
# (PYTHONPATH), the suite itself is this checkout's.
#
#   bench/ab.sh BASE ROUNDS BACKENDS ONLY [bench/suite.py options]
#   bench/ab.sh HEAD~1 3 sqlite e2e --e2e-runs 10000 --duration 3
#   bench/ab.sh main 4 postgresql idle --postgres-url postgresql://postgres@127.0.0.1:5432/postgres
#
# Prints each round's figures; take the medians of each side.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
base_rev=$1 rounds=$2 backends=$3 only=$4
shift 4
here=$(cd "$(dirname "$0")/.." && pwd)
base=$(mktemp -d "${TMPDIR:-/tmp}/flowhook-ab-XXXXXX")
out=$(mktemp -d "${TMPDIR:-/tmp}/flowhook-ab-results-XXXXXX")
git -C "$here" worktree add --detach --force "$base" "$base_rev" >/dev/null
trap 'git -C "$here" worktree remove --force "$base"; rm -rf "$out"' EXIT
for i in $(seq 1 "$rounds"); do
  if ((i % 2)); then order=("$base" "$here"); else order=("$here" "$base"); fi
  for side in "${order[@]}"; do
    if [ "$side" = "$here" ]; then label="change"; else label="base $base_rev"; fi
    echo "== pair $i: $label"
    PYTHONPATH=$side "$here/.venv/bin/python" "$here/bench/suite.py" --repeat 1 \
      --backends "$backends" --only "$only" --out "$out" "$@" | grep "round 1" | sed 's/.*round 1//'
  done
done
