#!/bin/bash
# Decoding before and after the tree sum in batch_decode_attention, in one run on one machine: the tree
# before (BEFORE, default ff3766b, the commit before the change) and this checkout, alternated twice.
# Run with the venv active, from anywhere; writes results.jsonl beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../../.." && pwd)
before=${BEFORE:-ff3766b}; old=$(mktemp -d)
git -C "$root" worktree add -f --detach "$old" "$before" -q
trap 'git -C "$root" worktree remove --force "$old"' EXIT
: > "$here/results.jsonl"
for round in 1 2; do
  PYTHONPATH="$old/src" python "$here/bench.py" --tree before "$@" | tee -a "$here/results.jsonl"
  PYTHONPATH="$root/src" python "$here/bench.py" --tree after "$@" | tee -a "$here/results.jsonl"
done
