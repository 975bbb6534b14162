#!/usr/bin/env bash
# Before/after benchmark of the engine change (issue 20), interleaved on one machine:
# "before" = the engine at commit 274adfa checked out in a worktree, "after" = this checkout.
#   git worktree add /tmp/old 274adfa && bash docs/results/bench-engine-before-after/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/results/bench-engine-before-after
for len in 32k 128k; do
  PYTHONPATH=/tmp/old/src .venv/bin/reform bench --methods reform,h2o --lengths $len --out $out/before-$len
  .venv/bin/reform bench --methods reform,h2o --lengths $len --out $out/after-$len
done
