"""The same NIAH rows answered on two machines, set by set: each draw's count of needles read, how many answers are
the same text (first 40 characters), and the rows whose score differs.

- bf16 grid, 8k-128k: the preset (heads-chains-smollm2) and the synthetic heads (heads-smollm2-suites) on a 2-core
  Zen 5 (AVX512-BF16), against this folder's rows (seed 0 on a Zen 4, seeds 1 and 2 on an Intel Xeon with AMX).
- fp32, 8k-32k, seeds 3-5: the earlier fp32 rows (Zen 3: gap-marks-smollm2, heads-second-draw-smollm2; Zen 4: this
  folder; preset-whole on seeds 3-4 was the lab's patch that ``min_run`` replaced) against ``amx-fp32/`` (Intel AMX).

    python docs/results/whole-runs-smollm2/machines.py
"""
import json
from pathlib import Path

RESULTS = Path(__file__).parent.parent
HERE = Path(__file__).parent
GRID = (("seed 0", "niah-grid-seed0", "niah-grid-seed0-synthetic"), ("seed 1", "niah-grid-seed1", "niah-grid-seed1"),
        ("seed 2, essays", "niah-grid-seed2-essays", "niah-grid-seed2-essays"))
SYNTHETIC_FP32 = {3: RESULTS / "gap-marks-smollm2", 4: RESULTS / "heads-second-draw-smollm2", 5: HERE}


def answers(folder: Path, wanted) -> dict[str, tuple[float, str]]:
    rows = (json.loads(line) for line in (folder / "predictions.jsonl").open())
    return {r["id"]: (r["score"], r["prediction"][:40]) for r in rows if wanted(r["method"])}


def compare(name: str, before: dict, here: dict, machines: str, machine: str = "Intel AMX") -> None:
    same = sum(before[k] == here.get(k) for k in before)
    print(f"{name}: {machines} {sum(s for s, _ in before.values()):.0f}/{len(before)}, {machine} "
          f"{sum(s for s, _ in here.values()):.0f}/{len(here)}, same text on {same}")
    for k in before:
        if k in here and before[k][0] != here[k][0]:
            print(f"    {k}: {machines} {before[k]!r}, {machine} {here[k]!r}")


def named(name: str):
    return lambda method: method == name


if __name__ == "__main__":
    print("bf16 grid:")
    for draw, preset_dir, synthetic_dir in GRID:
        machine = "Zen 4" if draw == "seed 0" else "Intel AMX"
        compare(f"  preset, {draw}", answers(RESULTS / "heads-chains-smollm2" / preset_dir, bool),
                answers(HERE / preset_dir, named("preset")), "Zen 5", machine)
        compare(f"  synthetic, {draw}", answers(RESULTS / "heads-smollm2-suites" / synthetic_dir,
                                                lambda m: "synthetic" in m),
                answers(HERE / preset_dir, named("synthetic")), "Zen 5", machine)
    print("fp32, 8k-32k x 5 depths:")
    for seed, synthetic in SYNTHETIC_FP32.items():
        amx = HERE / "amx-fp32" / f"niah-8k-32k-seed{seed}"
        if not (amx / "predictions.jsonl").exists():
            print(f"  seed {seed}: not run here")
            continue
        for name, folder in (("preset", HERE), ("preset-whole", HERE), ("synthetic", synthetic)):
            compare(f"  {name}, seed {seed}", answers(folder / f"niah-8k-32k-seed{seed}", named(name)),
                    answers(amx, named(name)), "Zen 3/4")
