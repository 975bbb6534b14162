#!/usr/bin/env bash
# Ask every needle question made by make_needle_files.py with `reform ask --json`; one JSON line each.
#   bash scripts/run_needles.sh runs/needle64k [extra reform ask options]
set -euo pipefail
dir=$1; shift
python - "$dir" "$@" <<'PY'
import json, subprocess, sys
d, extra = sys.argv[1], sys.argv[2:]
for row in json.load(open(f"{d}/needles.json")):
    r = subprocess.run(["reform", "ask", row["file"], "--question", row["question"], "--answer-prefix",
                        row["answer_prefix"], "--json", *extra], capture_output=True, text=True)
    if r.returncode:
        print(json.dumps({"depth": row["depth"], "error": r.stderr.strip().splitlines()[-1:]}), flush=True)
        continue
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res.update(depth=row["depth"], expected=row["answer"], correct=row["answer"] in res["answer"])
    print(json.dumps(res), flush=True)
PY
