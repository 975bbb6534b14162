#!/bin/bash
# Issue 69's NIAH line: the preset's gather without its pieces (gather_variants.whole_runs: runs shorter than
# 32 tokens dropped, their budget extending the runs kept), against the preset as shipped, on the rows of the
# earlier fp32 draws (vt seed 2 as gap-marks-smollm2, NIAH seeds 3-4, RULER-13 seeds 3-4). fp32; each context
# is encoded once with the 10-head union; a re-run answers only what is missing. The venv active, from anywhere.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/whole-runs-smollm2
source docs/results/gap-marks-smollm2/sets.sh
SETS="preset=$P;preset-whole=$P|whole=32"
cd scripts/labs
python suite_heads_lab.py ruler-official ../../$D/vt-seed2 $U "$SETS" --lengths 32k --tasks vt --samples 10 --seed 2 --dtype fp32
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed3 $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 3 --dtype fp32
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed4 $U "$SETS" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 4 --dtype fp32
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed3 $U "$SETS" --lengths 32k --seed 3 --dtype fp32
# the second session's steps (the rule in README.md, written before they ran): the synthetic heads answer too
SETS3="$SETS;synthetic=$S|pool_window=129"
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed4 $U "$SETS3" --lengths 32k --seed 4 --dtype fp32
python suite_heads_lab.py ruler-official ../../$D/ruler13-seed5 $U "$SETS3" --lengths 32k --seed 5 --dtype fp32
python suite_heads_lab.py niah ../../$D/niah-8k-32k-seed5 $U "$SETS3" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed 5 --dtype fp32
python suite_heads_lab.py ruler-official ../../$D/qa-32k-seed0 $U "$SETS3" --lengths 32k --tasks qa_1,qa_2 --samples 20 --seed 0   # the machine's dtype (bf16 where it has it)
# After the rule: the library's `min_run` (methods/whole_runs.py) against the lab's patch, on rows the lab answered
# (NIAH 8k, seed 3, fp32).
python suite_heads_lab.py niah ../../$D/library-check-8k-seed3 $U "preset-whole=$P|min_run=32" --lengths 8k --depths 0,0.25,0.5,0.75,1 --seed 3 --dtype fp32
# For the owner's choice (ship min_run=32 in the preset or not): the NIAH grid to 128k (bf16, the grid's dtype in
# heads-chains-smollm2), the library's min_run in place of the lab's patch; min_run=0 keeps the other sets as shipped.
SETS4="preset=$P|min_run=0;preset-whole=$P|min_run=32;synthetic=$S|pool_window=129+min_run=0"
python suite_heads_lab.py niah ../../$D/niah-grid-seed0 $U "$SETS4" --lengths 8k,16k,32k,64k,128k --depths 0,0.25,0.5,0.75,1 --seed 0
# The second rule (README.md, written before these ran): the heads table's other two grid draws, then the
# built-in RULER-style suite.
python suite_heads_lab.py niah ../../$D/niah-grid-seed1 $U "$SETS4" --lengths 8k,16k,32k,64k,128k --depths 0,0.25,0.5,0.75,1 --seed 1
python suite_heads_lab.py ruler ../../$D/ruler-builtin-seed2 $U "$SETS4" --lengths 32k --seed 2 --dtype fp32
python -c "import json, long_context_eval as l, pathlib as p; t = json.loads((p.Path(l.__file__).parent / 'data/synthetic/json/PaulGrahamEssays.json').read_text())['text']; p.Path('essays').mkdir(exist_ok=True); (p.Path('essays') / 'essays.txt').write_text(t)"
python suite_heads_lab.py niah ../../$D/niah-grid-seed2-essays $U "$SETS4" --lengths 8k,16k,32k,64k,128k --depths 0,0.25,0.5,0.75,1 --seed 2 --haystack essays
# The same fp32 NIAH rows on another CPU (machines.py compares them with the earlier machines' rows)
for seed in 3 4 5; do
  python suite_heads_lab.py niah ../../$D/amx-fp32/niah-8k-32k-seed$seed $U "$SETS4" --lengths 8k,16k,32k --depths 0,0.25,0.5,0.75,1 --seed $seed --dtype fp32
done
