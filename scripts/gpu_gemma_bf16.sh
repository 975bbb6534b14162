#!/bin/bash
# Gemma 3 270M in its default dtype on a lent GPU machine: the rows that need bf16 hardware
# (docs/gemma-3-270m.md, "Not measured yet"), most needed first, each under its own time limit.
#
#   bash scripts/gpu_gemma_bf16.sh MODEL OUT        MODEL: gemma-3-270m or the carried GGUF file
#
# All four steps take up to 790 s, over one call's 600: run STEPS=cpu128,cpu1m (up to 450 s) in one call and
# STEPS=gpuruler,gpu1m (up to 340 s) in the next, on the same warm machine.
#
#   cpu128    the host CPU in bf16 (AMX / AVX512-BF16): the 128k needle at depths 0, 25, 75, 100 %
#   cpu1m     the host CPU in bf16: the 1M needle at depths 10, 50, 90 %
#   gpuruler  the GPU: the RULER-style NIAH family + vt at 128k, 5 samples per task (the rows the 2-core
#             Zen 3 ran in fp32, so the two dtypes compare row by row)
#   gpu1m     the GPU: the 1M needle at depths 0, 25, 75, 100 % (10/50/90 % ran on an H200 before)
#
# Each step is a resumable `reform eval` folder under OUT; OUT/gemma-bf16.tgz is repacked after every step,
# so a call cut short still returns what finished; a step stopped at its time limit says so and the next
# one starts. Environment: STEPS (the list above, comma-separated); L128, L1M, SAMPLES, TASKS, MAX_ROWS
# (small values for a smoke run, tests/test_gpu_check.py); T_CPU128 T_CPU1M T_GPURULER T_GPU1M (seconds per step); PYTHON.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: bash scripts/gpu_gemma_bf16.sh MODEL OUT" >&2; exit 2; }
model=$1; out=$2
STEPS=${STEPS:-cpu128,cpu1m,gpuruler,gpu1m}
L128=${L128:-128k}; L1M=${L1M:-1M}; SAMPLES=${SAMPLES:-5}
T_CPU128=${T_CPU128:-120}; T_CPU1M=${T_CPU1M:-330}; T_GPURULER=${T_GPURULER:-240}; T_GPU1M=${T_GPU1M:-100}
TASKS=${TASKS:-niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt}
PACK=gemma-bf16.tgz
source "$(dirname "$0")/gpu_eval_step.sh"

step cpu128 "$T_CPU128" niah --device cpu --lengths "$L128" --depths 0,0.25,0.75,1 --samples 1
step cpu1m "$T_CPU1M" niah --device cpu --lengths "$L1M" --depths 0.1,0.5,0.9 --samples 1
step gpuruler "$T_GPURULER" ruler --lengths "$L128" --samples "$SAMPLES" --tasks "$TASKS"
step gpu1m "$T_GPU1M" niah --lengths "$L1M" --depths 0,0.25,0.75,1 --samples 1
grep -h -A4 "rows answered" "$out"/*/results.md 2>/dev/null
exit 0
