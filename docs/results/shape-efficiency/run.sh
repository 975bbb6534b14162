#!/usr/bin/env bash
# Encode FLOP efficiency by model shape, on one machine in one session, run back to back.
# Random-weight models of popular shapes (scripts/random_shape_model.py: the packaged tokenizer, an 8k
# window so chunk = cache = 2048 tokens as for SmolLM2, 5 layers; REFORM's fallback heads at 40 % depth,
# so the encode runs 3 of them). Timings are real, answers are noise ("correct" 0 %).
# Also: the real SmolLM2 in the same session, the attention kernels at both head dims, and where the
# time goes at each shape.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=../../..
PY=$ROOT/.venv/bin/python
R=$ROOT/.venv/bin/reform
MODELS=${MODELS:-/tmp/reform-shapes}
lscpu > lscpu.txt
step() { [ -f "$1/bench.json" ] || "${@:2}" --out "$1"; }     # resumable: a finished step is kept
step smollm2-135m-real $R bench --methods reform --lengths 16k
for shape in smollm2-135m qwen2.5-0.5b llama-3.2-1b qwen2.5-1.5b llama-3.1-8b; do
  [ -f "$MODELS/$shape/config.json" ] || $PY $ROOT/scripts/random_shape_model.py $shape --layers 5 --out "$MODELS/$shape"
  step "$shape" $R bench --model "$MODELS/$shape" --methods reform --lengths 16k
  [ -f "breakdown-$shape.txt" ] || $PY $ROOT/scripts/encode_time_breakdown.py --model "$MODELS/$shape" > "breakdown-$shape.txt"
done
[ -f attention-head-dim-64.txt ] || $PY $ROOT/scripts/attention_kernel_throughput.py > attention-head-dim-64.txt
[ -f attention-head-dim-128.txt ] || $PY $ROOT/scripts/attention_kernel_throughput.py --head-dim 128 --heads 12 --kv-heads 2 --hidden 1536 --ffn 8960 > attention-head-dim-128.txt
