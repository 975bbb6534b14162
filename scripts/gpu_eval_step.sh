#!/bin/bash
# Sourced by the prepared GPU scripts (gpu_gemma_bf16.sh, gpu_gather_synthetic.sh): one resumable
# `reform eval` folder per step under its own time limit, OUT/$PACK repacked after every step so that a
# call cut short still returns what finished. The caller sets model, out, STEPS and PACK (and PYTHON, or
# python3 runs reform); sourcing checks that reform is importable and makes OUT.
#
#   step NAME LIMIT reform-eval-args...     runs only when NAME is in the comma-separated $STEPS
PYTHON=${PYTHON:-python3}; reform=("$PYTHON" -m reform)
"$PYTHON" -c "import reform" 2>/dev/null || { echo "reform is not importable: set PYTHONPATH=\$PWD/src" >&2; exit 2; }
mkdir -p "$out" || exit 2
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

step() {
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",$name,"*) ;; *) return 0 ;; esac
  local start; start=$(date +%s)
  echo "== ${reform[*]} eval $* --model $model --out $out/$name" >> "$out/$name.log"
  timeout "$limit" "${reform[@]}" eval "$@" --model "$model" --out "$out/$name" ${MAX_ROWS:+--max-rows "$MAX_ROWS"} >> "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "$name: stopped at its limit of $limit s (the rows before it are kept)" || echo "$name: rc=$rc"
  echo "$name: $(( $(date +%s) - start )) s"
  tar czf "$out/$PACK" -C "$out" --exclude "$PACK" . 2>/dev/null
}
