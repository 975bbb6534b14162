"""Encode a long file once, then ask it two questions; prints encode time and each ask's time (JSON).

    python scripts/ask_twice.py runs/needle64k/depth050.txt "What is the special magic number for ...?" "..."
"""

import json
import sys
import time

from reform.pipeline import Pipeline

path, questions = sys.argv[1], sys.argv[2:] or ["What is this text about?"]
pipe = Pipeline.load()
text = open(path).read()
t = time.perf_counter()
ctx = pipe.encode(text)
encode_s = time.perf_counter() - t
asks = []
for q in questions:
    t = time.perf_counter()
    ans = ctx.ask(q, max_new_tokens=24)
    asks.append({"question": q, "answer": ans.text, "seconds": round(time.perf_counter() - t, 2),
                 "stats": ans.stats})
print(json.dumps({"tokens": int(ctx.ids.shape[0]), "encode_seconds": round(encode_s, 2), "asks": asks}, indent=1))
