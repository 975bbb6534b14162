"""Write single-needle haystack files for `reform ask` (one per depth) and a JSON of questions/answers.

    python scripts/make_needle_files.py --tokens 65536 --depths 0.1,0.3,0.5,0.7,0.9 --out runs/needle64k
    python scripts/make_needle_files.py --model gemma-3-270m --tokens 131072 --depths 0,0.25,0.5,0.75,1 --out runs/gemma128k

``--tokens`` counts the tokens of ``--model``'s tokenizer (default: the packaged SmolLM2).
"""

import argparse
import json
import random
from pathlib import Path

from reform.data.haystack import haystack, insert_needle, magic_number_needle
from reform.model import load_model
from reform.engine.layout import Templater

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", type=int, default=65536)
ap.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--out", default="runs/needle")
ap.add_argument("--model", default=None, help="the model whose tokenizer sizes the haystack (default: SmolLM2)")
args = ap.parse_args()

tok = load_model(args.model).tokenizer
tmpl = Templater(tok)
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
rows = []
for i, depth in enumerate(float(d) for d in args.depths.split(",")):
    rng = random.Random(args.seed * 1000 + i)
    needle = magic_number_needle(rng)
    text = insert_needle(haystack(args.tokens, lambda t: len(tmpl.encode(t)), rng=rng), needle.sentence, depth)
    path = out / f"depth{int(depth * 100):03d}.txt"
    path.write_text(text)
    rows.append({"file": str(path), "depth": depth, "tokens": len(tmpl.context(text)), "question": needle.question,
                 "answer_prefix": needle.answer_prefix, "answer": needle.answer})
(out / "needles.json").write_text(json.dumps(rows, indent=1))
print(json.dumps(rows, indent=1))
