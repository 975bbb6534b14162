#!/usr/bin/env bash
# Two more alternating pairs of REFORM at 32k (before, after, before, after) to judge run-to-run noise.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/results/bench-engine-before-after
for i in 3 4; do
  PYTHONPATH=/tmp/old/src .venv/bin/reform bench --methods reform --lengths 32k --out $out/before-32k-reform-$i
  .venv/bin/reform bench --methods reform --lengths 32k --out $out/after-32k-reform-$i
done
