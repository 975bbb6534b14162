#!/bin/bash
# RULER's 13 official tasks at 128k (4x Gemma 3 270M's 32k window): REFORM beside rag-dense and truncation
# at Gemma's recompute budget, one row per task, seed 3. Resumable: a re-run answers only what is missing.
# Run with the venv active, from anywhere.
set -e
cd "$(dirname "$0")/../../.."
reform eval ruler --model gemma-3-270m --generator official --lengths 128k --samples 1 --seed 3 \
  --methods reform,rag-dense,truncate --out docs/results/eval-ruler13-128k-gemma/seed3
