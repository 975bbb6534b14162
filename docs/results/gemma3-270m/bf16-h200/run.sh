#!/bin/bash
# Carried in 7 parts: transformers 5.24 (5.17 here reads Gemma 3's GGUF tokenizer wrongly), gguf, the Gemma 3
# 270M and SmolLM2-135M-Instruct GGUFs. Gemma in its default dtype (bf16): the needle at 128k, 5 depths, on
# the GPU, one depth on the host CPU (AMX), 1M at 3 depths; then SmolLM2's recall-lab NIAH grid at 1M.
G128=${G128:-110}; GCPU=${GCPU:-60}; G1M=${G1M:-100}; S1ME=${S1ME:-150}; S1MM=${S1MM:-70}
mkdir -p /tmp/p
cp .x7/q6 /tmp/p/ && (cd /tmp/p && sha256sum -c --quiet $OLDPWD/.x7/sums.txt && cat q0 q1 q2 q3 q4 q5 q6 | tar xf - && rm q?) || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/p/*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
mkdir -p /tmp/o; pack() { tar czf $OUT/results.tgz -C /tmp/o .; }
G=/tmp/p/gemma-3-270m-q4_k_m.gguf; S=/tmp/p/SmolLM2-135M-Instruct.Q4_1.gguf
ev() { name=$1; t=$2; shift 2; s=$(date +%s); echo "== $name $*" >> /tmp/o/eval.log
  timeout $t python3 -m reform eval niah --model $G --samples 1 --out /tmp/o/$name "$@" >> /tmp/o/eval.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - s )) s"; pack; }
lab() { t=$1; shift; s=$(date +%s); echo "== $*" >> /tmp/o/lab.log
  timeout $t python3 scripts/recall_lab.py "$@" --model $S >> /tmp/o/lab.log 2>&1; echo "lab $1 rc=$? $(( $(date +%s) - s )) s"; pack; }
ev gemma-niah-128k-gpu $G128 --lengths 128k --depths 0,0.25,0.5,0.75,1
ev gemma-niah-128k-cpu-amx $GCPU --device cpu --lengths 128k --depths 0.5
ev gemma-niah-1m-gpu $G1M --lengths 1M --depths 0.1,0.5,0.9
lab $S1ME encode --contexts /tmp/g1m --suite niah --tasks niah --lengths 1M --samples 1 --depths 0,0.25,0.5,0.75,1
lab $S1MM measure --contexts /tmp/g1m --out /tmp/o/smollm2-grid1m --variants paper,runpeaks1 --answer-runs runpeaks1
grep -h "rows answered" -A2 /tmp/o/*/results.md; cat /tmp/o/smollm2-grid1m/recall.md 2>/dev/null | head -30
