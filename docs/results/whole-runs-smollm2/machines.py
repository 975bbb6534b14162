"""The same NIAH grid rows answered on two machines in bf16: the preset (heads-chains-smollm2) and the synthetic
heads (heads-smollm2-suites), both from a 2-core Zen 5 (AVX512-BF16), against this folder's rows of the same sets
(seed 0 on a Zen 4, seeds 1 and 2 on an Intel Xeon with AMX). Prints each draw's count of needles read, how many
answers are the same text (first 40 characters), and the rows whose score differs.

    python docs/results/whole-runs-smollm2/machines.py
"""
import json
from pathlib import Path

RESULTS = Path(__file__).parent.parent
DRAWS = (("seed 0", "niah-grid-seed0", "niah-grid-seed0-synthetic"), ("seed 1", "niah-grid-seed1", "niah-grid-seed1"),
         ("seed 2, essays", "niah-grid-seed2-essays", "niah-grid-seed2-essays"))


def answers(path: Path, wanted) -> dict[str, tuple[float, str]]:
    rows = (json.loads(line) for line in path.open())
    return {r["id"]: (r["score"], r["prediction"][:40]) for r in rows if wanted(r["method"])}


def compare(name: str, zen5: dict, here: dict) -> None:
    same = sum(zen5[k] == here[k] for k in zen5)
    print(f"{name}: Zen 5 {sum(s for s, _ in zen5.values()):.0f}/{len(zen5)}, here "
          f"{sum(s for s, _ in here.values()):.0f}/{len(here)}, same text on {same}")
    for k in zen5:
        if zen5[k][0] != here[k][0]:
            print(f"    {k}: Zen 5 {zen5[k]!r}, here {here[k]!r}")


if __name__ == "__main__":
    for draw, preset_dir, synthetic_dir in DRAWS:
        here = RESULTS / "whole-runs-smollm2" / preset_dir / "predictions.jsonl"
        compare(f"preset, {draw}", answers(RESULTS / "heads-chains-smollm2" / preset_dir / "predictions.jsonl", bool),
                answers(here, lambda m: m == "preset"))
        compare(f"synthetic, {draw}", answers(RESULTS / "heads-smollm2-suites" / synthetic_dir / "predictions.jsonl",
                                              lambda m: "synthetic" in m),
                answers(here, lambda m: m == "synthetic"))
