#!/bin/bash
# Issue 69's NIAH line: SmolLM2's preset misreads needles it gathers whole. Its maxsim gather scores each
# token as the centre of a window only, and keeps combs of 1-20-token pieces at the budget's cut-off.
# preset-pooled: the same gather with the window scores max-pooled over the window (gather_variants.
# pooled_windows). The synthetic heads (pool 129) for reference. fp32, as the earlier draws; each context
# is encoded once with the 10-head union; a re-run answers only what is missing. The venv active, from anywhere.
# Stopped on 2026-12-01 after 2 vt rows (README): whole windows lose the chain; the NIAH and RULER-13
# steps planned after it were dropped (whole-runs-smollm2 measures the next variant on them).
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/pooled-windows-smollm2
source docs/results/gap-marks-smollm2/sets.sh
SETS="preset=$P;preset-pooled=$P|pooled=1;synthetic=$S|pool_window=129"
cd scripts/labs
python suite_heads_lab.py ruler-official ../../$D/vt-seed2 $U "$SETS" --lengths 32k --tasks vt --samples 10 --seed 2 --dtype fp32
