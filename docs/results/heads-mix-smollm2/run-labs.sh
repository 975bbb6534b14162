set -x
.venv/bin/python scripts/labs/ruler_qa_lab.py smollm2 32768 docs/results/heads-mix-smollm2/ruler-qa-32k.jsonl docs/results/gather-heads-smollm2/union.json --samples 20 --explain 2 --variants default \
  --subsets "shipped=2:q:2+6:k:2+15:v:1+18:v:1;synthetic=5:v:2+3:k:2+12:v:1+18:v:2;mix1=2:q:2+6:k:2+12:v:1+18:v:2;mix2=5:v:2+3:k:2+15:v:1+18:v:1;six=2:q:2+6:k:2+15:v:1+18:v:1+12:v:1+18:v:2;both=5:v:2+3:k:2+12:v:1+18:v:2+2:q:2+6:k:2+15:v:1+18:v:1" > docs/results/heads-mix-smollm2/ruler-qa-32k.log 2>&1
.venv/bin/python scripts/labs/docs_gather_lab.py smollm2 /work/labctx/union-smollm2 docs/results/heads-mix-smollm2/docs-smollm2.jsonl \
  "heads:2:q:2+6:k:2+12:v:1+18:v:2,heads:5:v:2+3:k:2+15:v:1+18:v:1,heads:2:q:2+6:k:2+15:v:1+18:v:1+12:v:1+18:v:2,heads:5:v:2+3:k:2+12:v:1+18:v:2+2:q:2+6:k:2+15:v:1+18:v:1,documents:2:q:2+6:k:2+12:v:1+18:v:2" docs/results/gather-heads-smollm2/union.json > docs/results/heads-mix-smollm2/docs-smollm2.log 2>&1
