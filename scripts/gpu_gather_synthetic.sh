#!/bin/bash
# Issue 56's synthetic check on a lent GPU machine: does the gather recommended for documents
# (REFORM+RAG with dense + BM25 scores, max-pooled: `reform+rag:retriever=dense+bm25:pool_passages=true`) lower the synthetic suites
# against REFORM's own gather? Both methods answer the same rows in one run (docs/evaluation.md).
#
#   bash scripts/gpu_gather_synthetic.sh MODEL OUT        MODEL: smollm2-135m, gemma-3-270m or a carried GGUF
#
#   ruler     the RULER-style NIAH family + vt at $LENGTHS, $SAMPLES samples per task
#   niah      the NIAH grid (REFORM §4.1) at $LENGTHS, depths 0/25/50/75/100 %
#   babilong  BABILong-style qa1-qa5 at $LENGTHS, $SAMPLES samples per task
#
# Each step is a resumable `reform eval` folder under OUT under its own time limit; OUT/gather-synthetic.tgz
# is repacked after every step (scripts/gpu_eval_step.sh), so a call cut short still returns what finished
# and the same command in the next call goes on where it stopped. Environment: STEPS (comma-separated),
# METHODS, LENGTHS, SAMPLES, TASKS, MAX_ROWS (small values for a smoke run, tests/test_gpu_check.py);
# T_RULER T_NIAH T_BABILONG (seconds per step); PYTHON.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: bash scripts/gpu_gather_synthetic.sh MODEL OUT" >&2; exit 2; }
model=$1; out=$2
STEPS=${STEPS:-ruler,niah,babilong}
METHODS=${METHODS:-reform,reform+rag:retriever=dense+bm25:pool_passages=true}
LENGTHS=${LENGTHS:-32k,64k,128k}; SAMPLES=${SAMPLES:-2}
TASKS=${TASKS:-niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt}
T_RULER=${T_RULER:-300}; T_NIAH=${T_NIAH:-100}; T_BABILONG=${T_BABILONG:-120}
PACK=gather-synthetic.tgz
source "$(dirname "$0")/gpu_eval_step.sh"

step ruler "$T_RULER" ruler --methods "$METHODS" --lengths "$LENGTHS" --samples "$SAMPLES" --tasks "$TASKS"
step niah "$T_NIAH" niah --methods "$METHODS" --lengths "$LENGTHS" --depths 0,0.25,0.5,0.75,1 --samples 1
step babilong "$T_BABILONG" babilong --methods "$METHODS" --lengths "$LENGTHS" --samples "$SAMPLES" --tasks qa1,qa2,qa3,qa4,qa5
grep -h -B2 -A8 "rows answered" "$out"/*/results.md 2>/dev/null
exit 0
