"""Benchmark pictures: time and peak memory against input length per method (log-log), and where the
time of each run goes (stage breakdown)."""

from __future__ import annotations

from pathlib import Path

from ..eval.plots import _pyplot, _save
from ..eval.specs import format_length


def _by_method(summary: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in sorted(summary, key=lambda r: r["input_tokens"]):
        out.setdefault(row["method"], []).append(row)
    return out


def _versus_length(result: dict, key: str, ylabel: str, title: str, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, rows in _by_method(result["summary"]).items():
        ax.plot([r["input_tokens"] for r in rows], [r[key] for r in rows], marker="o", label=method)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("input tokens")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def stage_bars(result: dict, path: Path) -> Path:
    """Stacked median seconds per stage for every (method, length)."""
    plt = _pyplot()
    rows = sorted(result["summary"], key=lambda r: (r["input_tokens"], r["method"]))
    stages = ("encode", "gather", "recompute", "generate")
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 4))
    labels = [f"{r['method']}\n{format_length(r['length'])}" for r in rows]
    bottom = [0.0] * len(rows)
    for stage in stages:
        vals = [r.get(f"{stage}_s_median", 0.0) for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("seconds (median)")
    ax.set_title("where the time goes")
    ax.legend()
    ax.tick_params(axis="x", labelsize=8)
    return _save(fig, path)


def plot_bench(result: dict, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    return [_versus_length(result, "wall_s_median", "seconds (encode + answer)", "time vs input length",
                           out_dir / "time_vs_length.png"),
            _versus_length(result, "peak_rss_mb_median", "peak RSS (MB)", "peak memory vs input length",
                           out_dir / "memory_vs_length.png"),
            stage_bars(result, out_dir / "stages.png")]
