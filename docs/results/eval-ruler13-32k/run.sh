#!/bin/bash
# RULER's 13 official tasks at 32k (4x SmolLM2's window): REFORM beside rag-dense and truncation at the
# same 1,024-token budget, one row per task and seed. Resumable: a re-run answers only what is missing.
# Order: seed 3 with every method; rag-dense and truncation at seeds 4 and 5; REFORM at seeds 4 and 5
# last (heads-second-draw-smollm2's lab answered those rows with the preset; summary.py uses the lab's
# rows where this run has none, and says so). Run with the venv active, from anywhere.
set -e
cd "$(dirname "$0")/../../.."
D=docs/results/eval-ruler13-32k
run() { reform eval ruler --generator official --lengths 32k --samples 1 --seed $1 --methods $2 --out $D/seed$1; }
run 3 reform,rag-dense,truncate
run 4 rag-dense,truncate
run 5 rag-dense,truncate
run 4 reform
run 5 reform
