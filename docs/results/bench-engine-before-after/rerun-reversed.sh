#!/usr/bin/env bash
# The 32k pair again in the reverse order (after first), to see how much of the difference is drift.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/results/bench-engine-before-after
.venv/bin/reform bench --methods reform,h2o --lengths 32k --out $out/after-32k-second
PYTHONPATH=/tmp/old/src .venv/bin/reform bench --methods reform,h2o --lengths 32k --out $out/before-32k-second
