"""∞-Bench's six synthetic tasks (passkey, number_string, kv_retrieval, math_find, math_calc, code_run) by
the recipes of the official ``data/construct_synthetic_dataset.py`` (github.com/OpenBMB/InfiniteBench,
MIT), in the official schema with answers in lists as the released files have them, scaled from their 128k
sizes to any length: a user without the download can run them at 1M tokens (``infinitebench.load_rows``
reads what ``generate`` writes)."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

SYNTHETIC = ("passkey", "number_string", "kv_retrieval", "math_find", "math_calc", "code_run")

FULL = 128 * 1024
# Items per context for 128k tokens of the default model's tokenizer (SmolLM2's, measured on generated files;
# other tokenizers differ most on UUIDs and numbers), scaled linearly to other lengths. The official recipes
# use 5220 noise lines, 2500 JSON pairs, 60000 and 30000 numbers and 550 functions for their files.
PER_128K = {"noise_lines": 5220, "kv_pairs": 1867, "find_numbers": 33825, "calc_terms": 36330, "functions": 5805}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"


def scaled(count_at_128k: int, length: int) -> int:
    return max(1, round(count_at_128k * length / FULL))


def noise_with(needle: str, lines: int, depth: float) -> str:
    before = round(lines * depth)
    return NOISE * before + needle + NOISE * (lines - before)


def depths(samples: int) -> list[float]:
    """The official files sweep the needle from the start to the end: ``samples`` depths from 0 to 1."""
    return [0.5] if samples == 1 else [i / (samples - 1) for i in range(samples)]


def make_passkey(rng: random.Random, length: int, samples: int) -> list[dict]:
    out = []
    for depth in depths(samples):
        key = "".join(str(rng.randint(0, 9)) for _ in range(5))
        needle = f"The pass key is {key}. Remember it. {key} is the pass key.\n"
        out.append({"input": "What is the pass key?", "context": noise_with(needle, scaled(PER_128K["noise_lines"], length), depth),
                    "answer": key})
    return out


def make_number_string(rng: random.Random, length: int, samples: int) -> list[dict]:
    out = []
    for depth in depths(samples):
        keys = [str(rng.randint(0, 9)) for _ in range(5)]
        for k in range(5):                         # five digits repeated in place: ten digits
            pos = rng.randint(0, 5 + k - 1)
            keys.insert(pos, keys[pos])
        key = "".join(keys)
        needle = f"The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n"
        out.append({"input": "What is the sequence of digits?", "answer": key,
                    "context": noise_with(needle, scaled(PER_128K["noise_lines"], length), depth)})
    return out


def make_kv_retrieval(rng: random.Random, length: int, samples: int) -> list[dict]:
    """JSON of UUID keys and values (lost-in-the-middle's records), the asked pair moving through it."""
    out, pairs = [], scaled(PER_128K["kv_pairs"], length)
    for i, depth in enumerate(depths(samples)):
        records = [(str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    str(uuid.UUID(int=rng.getrandbits(128), version=4))) for _ in range(pairs)]
        key, value = records[min(round(depth * pairs), pairs - 1)]
        text = "JSON data:\n{" + ", ".join(f'"{k}": "{v}"' for k, v in records) + "}"
        out.append({"id": i, "context": text, "answer": value,
                    "input": f'\nKey: "{key}"\nThe value associated with the specified key is: '})
    return out


FIND_PROMPTS = {"largest number": max, "second largest number": None, "third largest number": None,
                "smallest number": min, "second smallest number": None, "third smallest number": None,
                "median": None}


def kth_distinct(values: list[int], k: int, largest: bool) -> int:
    """The official way: drop every copy of the extreme value k-1 times, then take the extreme."""
    left = sorted(set(values), reverse=largest)
    return left[min(k, len(left)) - 1]


def find_answer(target: str, values: list[int]):
    if target == "median":
        s, n = sorted(values), len(values)
        return s[n // 2] if n % 2 else (s[n // 2] + s[n // 2 - 1]) / 2
    k = {"": 1, "second ": 2, "third ": 3}[target.split("largest")[0].split("smallest")[0]]
    return kth_distinct(values, k, "largest" in target)


def make_math_find(rng: random.Random, length: int, samples: int) -> list[dict]:
    out, size = [], scaled(PER_128K["find_numbers"], length)
    for i in range(samples):
        target = list(FIND_PROMPTS)[i % len(FIND_PROMPTS)]
        if "smallest" in target or (target == "median" and rng.random() > 0.5):
            low, high = rng.randint(0, int(99 * 0.2)), 99
        else:
            low, high = 0, rng.randint(int(99 * 0.8), 99)
        values = [rng.randint(low, high) for _ in range(size)]
        verb = "Calculate the median number" if target == "median" else f"Find the {target}"
        out.append({"prompt": f"{verb} from the list below:", "context": str(values),
                    "input": f"You should answer with only one number, no other words. The {target} of the list "
                             "is: ", "answer": find_answer(target, values)})
    return out


def make_math_calc(rng: random.Random, length: int, samples: int) -> list[dict]:
    out, size = [], scaled(PER_128K["calc_terms"], length)
    for _ in range(samples):
        value = rng.randint(0, 99)
        text, values = str(value), []
        for _ in range(1, size):
            if rng.random() > 0.5:
                term = rng.randint(0, 99 - value) if value + (n := rng.randint(0, 99)) > 99 else n
                text, value = f"{text} + {term}", value + term
            else:
                term = rng.randint(0, value) if value - (n := rng.randint(0, 99)) < 0 else n
                text, value = f"{text} - {term}", value - term
            values.append(value)
        out.append({"prompt": "Calculate the numerical expression and provide intermediate results only, for "
                              "example, for the expression 1 + 3 + 10 - 8, output 4, 14, 6 without displaying the "
                              "steps.\n\nCalculate the value of the expression below:",
                    "context": text, "input": "The value of the numerical expression is: ", "answer": values})
    return out


def make_code_run(rng: random.Random, length: int, samples: int) -> list[dict]:
    """Functions in layers, each calling one of the next layer with an offset; the last returns x plus one.
    The official file's 550 functions are about 10k tokens; here as many as fill ``length``."""
    out, total = [], scaled(PER_128K["functions"], length)
    for i in range(samples):
        layers = [2, 4, 6, 8, 10][i % 5]
        per = max(1, total // layers)
        names = rng.sample(range(1, 2 * total + 1), per * layers)
        tiers = [names[t * per:(t + 1) * per] for t in range(layers)]
        body, calls = {}, {}
        for t, tier in enumerate(tiers):
            for name in tier:
                add = rng.randint(-12, 17)
                inner = f"func_{rng.choice(tiers[t + 1])}(x)" if t < layers - 1 else "x"
                calls[name] = (inner, add)
                body[name] = f"def func_{name}(x):\n    return {inner}{'' if add == 0 else f' + {add}' if add > 0 else f' - {-add}'}\n"
        first, x = rng.choice(tiers[0]), rng.randint(-10, 10)
        value, name = x, first
        chain = []
        while True:                                   # follow the calls down to x
            inner, add = calls[name]
            chain.append(add)
            if inner == "x":
                break
            name = int(inner[5:-3])
        value = x + sum(chain)
        content = "\nHere is the content of functions_module.py:\n\n" + "\n".join(body[n] for n in sorted(body))
        out.append({"id": i, "context": content, "answer": value,
                    "input": f"Please give me the exact number of the return value of func_{first}({x}). Your "
                             "response should end with the sentence 'The return value is:'."})
    return out


MAKERS = {"passkey": make_passkey, "number_string": make_number_string, "kv_retrieval": make_kv_retrieval,
          "math_find": make_math_find, "math_calc": make_math_calc, "code_run": make_code_run}


def generate(out_dir: str | Path, length: int, samples: int, seed: int = 0, tasks: list[str] | None = None) -> list[Path]:
    """Write ``TASK.jsonl`` for each synthetic task (all six by default) at about ``length`` tokens, ``samples``
    examples each, deterministically by ``seed``, answers in the released files' shape; returns the files
    written."""
    chosen = list(SYNTHETIC) if not tasks else tasks
    unknown = [t for t in chosen if t not in SYNTHETIC]
    if unknown:
        raise ValueError(f"--generate writes only the synthetic tasks ({', '.join(SYNTHETIC)}), not "
                         f"{', '.join(unknown)}")
    if length < 1024 or samples < 1:
        raise ValueError("--generate needs a length of at least 1k tokens and at least one sample")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for task in chosen:
        rng = random.Random(f"{seed}-{task}-{length}")
        # every answer in a list, as the released files have them (Math.Calc's values nested: [[4, 2]])
        examples = [{"id": i, "options": [], **e, "answer": [e["answer"]]}
                    for i, e in enumerate(MAKERS[task](rng, length, samples))]
        path = out_dir / f"{task}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples), encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written
