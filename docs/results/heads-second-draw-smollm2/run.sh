#!/bin/bash
# A second fp32 draw for issue 69's last line (the NIAH grid and RULER-style suites not lower): the preset
# and the synthetic heads it replaced (pool 129), each also with gap marks, on seeds neither was chosen or
# tuned on. The same sets and lab as gap-marks-smollm2; each context is encoded once with the 10-head
# union; a re-run answers only what is missing. Run with the venv active, from anywhere.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/heads-second-draw-smollm2
source docs/results/gap-marks-smollm2/sets.sh
cd scripts/labs
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed4 $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 4
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed4 $U "$SETS" --lengths 32k --seed 4
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed5 $U "$SETS" --lengths 32k --seed 5
python suite_heads_lab.py ruler ../../$D/ruler-builtin-seed2 $U "$SETS" --lengths 32k --seed 2
