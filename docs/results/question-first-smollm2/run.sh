#!/bin/bash
# Issue 69's NIAH line: REFORM's question_first (the question read before the gathered tokens as well) for
# SmolLM2's preset, against the preset as shipped and the synthetic heads as they were when issue 69 was filed
# (pool 129, no question_first), by the rule in README.md. Each context is encoded once with the 10-head union;
# a re-run answers only what is missing. The venv active, from anywhere. Steps in the rule's order.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/question-first-smollm2
source docs/results/gap-marks-smollm2/sets.sh
SETS="preset=$P;preset-qf=$P|question_first=1;synthetic=$S|pool_window=129"
cd scripts/labs
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed6 $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 6 --dtype fp32
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed4 $U "$SETS" --lengths 32k --seed 4 --dtype fp32
python suite_heads_lab.py ruler-official ../../$D/qa-32k-seed0 $U "$SETS" --lengths 32k --tasks qa_1,qa_2 --samples 20 --seed 0   # the machine's dtype
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed3 $U "$SETS" --lengths 32k --seed 3 --dtype fp32
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed5 $U "$SETS" --lengths 32k --seed 5 --dtype fp32
for seed in 3 4 5; do
  python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed$seed $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed $seed --dtype fp32
done
python suite_heads_lab.py ruler ../../$D/ruler-builtin-seed2 $U "$SETS" --lengths 32k --seed 2 --dtype fp32
python -c "import json, long_context_eval as l, pathlib as p; t = json.loads((p.Path(l.__file__).parent / 'data/synthetic/json/PaulGrahamEssays.json').read_text())['text']; p.Path('essays').mkdir(exist_ok=True); (p.Path('essays') / 'essays.txt').write_text(t)"
GRID="--lengths 8k,16k,32k,64k,128k --depths 0,0.25,0.5,0.75,1"
python suite_heads_lab.py niah ../../$D/niah-grid-seed0 $U "$SETS" $GRID --seed 0
python suite_heads_lab.py niah ../../$D/niah-grid-seed1 $U "$SETS" $GRID --seed 1
python suite_heads_lab.py niah ../../$D/niah-grid-seed2-essays $U "$SETS" $GRID --seed 2 --haystack essays
# after the rule, for the owner's choice (not a line of the rule): line 3's qa rows at two fresh seeds
for seed in 1 2; do
  python suite_heads_lab.py ruler-official ../../$D/qa-32k-seed$seed $U "$SETS" --lengths 32k --tasks qa_1,qa_2 --samples 20 --seed $seed   # the machine's dtype
done
for seed in 7 8 9 10 11 12; do
  python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed$seed $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed $seed --dtype fp32
done
# the second rule's line B (line A is the NIAH step above)
for seed in 3 4; do
  python suite_heads_lab.py ruler-official ../../$D/qa-32k-seed$seed $U "$SETS" --lengths 32k --tasks qa_1,qa_2 --samples 20 --seed $seed   # the machine's dtype
done
