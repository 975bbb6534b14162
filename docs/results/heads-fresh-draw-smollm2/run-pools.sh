#!/bin/bash
# The preset's heads at pools 129 and 145 beside the three sets of run.sh, on the same rows (a re-run
# answers only the sets and rows not yet in each folder). Run with the venv active.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/heads-fresh-draw-smollm2
U=../../docs/results/gather-heads-smollm2/union.json
P=2:q:2+6:k:2+15:v:1+18:v:1+5:v:2
SETS="preset=$P;synthetic=5:v:2+3:k:2+12:v:1+18:v:2|pool_window=129;HotpotQA=2:q:2+6:k:2+15:v:1+18:v:1|pool_window=129;preset129=$P|pool_window=129;preset145=$P|pool_window=145"
cd scripts/labs
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed3 $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 3
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed3 $U "$SETS" --lengths 32k --seed 3
python suite_heads_lab.py ruler-official ../../$D/vt-seed2 $U "$SETS" --lengths 32k --tasks vt --samples 10 --seed 2
# then the built-in RULER-style suite (run.sh's last step), with all five sets
python suite_heads_lab.py ruler ../../$D/ruler-builtin-seed1 $U "$SETS" --lengths 32k --seed 1
