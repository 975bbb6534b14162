#!/bin/bash
# Gap marks (issue 69): the preset and the synthetic heads, each with REFORM's recompute as the paper joins
# the gathered runs and with " ...\n" between runs that are not contiguous (gather_variants.gap_marks), on
# the fresh draw's rows (heads-fresh-draw-smollm2: the same seeds, so the unmarked answers repeat its own).
# Each context is encoded once with the 10-head union; a re-run answers only what is missing. Run with the
# venv active, from anywhere.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/gap-marks-smollm2
source docs/results/gap-marks-smollm2/sets.sh
cd scripts/labs
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed3 $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 3
python suite_heads_lab.py ruler-official ../../$D/vt-seed2 $U "$SETS" --lengths 32k --tasks vt --samples 10 --seed 2
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed3 $U "$SETS" --lengths 32k --seed 3
