#!/bin/bash
# The fresh draw (issue 69): three SmolLM2 head sets answer the same new rows from one union encode per
# context (scripts/labs/suite_heads_lab.py). Run from the repository root.
set -e
D=docs/results/heads-fresh-draw-smollm2
U=../../docs/results/gather-heads-smollm2/union.json
SETS="preset=2:q:2+6:k:2+15:v:1+18:v:1+5:v:2;synthetic=5:v:2+3:k:2+12:v:1+18:v:2|pool_window=129;HotpotQA=2:q:2+6:k:2+15:v:1+18:v:1|pool_window=129"
cd scripts/labs
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed3 $U "$SETS" --lengths 32k --seed 3
python suite_heads_lab.py ruler-official ../../$D/vt-seed2 $U "$SETS" --lengths 32k --tasks vt --samples 10 --seed 2
# stopped after 16k on 2026-11-30 (time); a re-run goes on with the 32k rows
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed3 $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 3
# not reached on 2026-11-30
python suite_heads_lab.py ruler ../../$D/ruler-builtin-seed1 $U "$SETS" --lengths 32k --seed 1
