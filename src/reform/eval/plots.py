"""Pictures of an evaluation's metrics: NIAH-style depth x length heat maps (REFORM Figure 3), and score
and gold recall vs length per method with 95 % intervals."""

from __future__ import annotations

import math
import re
from pathlib import Path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "task"


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=90, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def depth_heat_maps(metrics: dict, out_dir: str | Path) -> list[Path]:
    """One PNG per task that has depths: a panel per method, x = context length, y = needle depth,
    colour and number = score (%), grey = not run."""
    from .specs import format_length
    plt = _pyplot()
    out_dir = Path(out_dir)
    paths = []
    tasks = list(dict.fromkeys(c["task"] for c in metrics["by_depth"]))
    for task in tasks:
        cells = {(c["method"], c["length"], c["depth"]): c["score"] for c in metrics["by_depth"] if c["task"] == task}
        methods = [m for m in metrics["methods"] if any(k[0] == m for k in cells)]
        lengths = sorted({k[1] for k in cells})
        depths = sorted({k[2] for k in cells})
        fig, axes = plt.subplots(1, len(methods), squeeze=False, sharey=True,
                                 figsize=(1.0 + (0.8 * len(lengths) + 1.2) * len(methods), 0.45 * len(depths) + 1.8))
        cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgrey")
        for ax, method in zip(axes[0], methods):
            grid = [[cells.get((method, n, d)) for n in lengths] for d in depths]
            values = [[math.nan if v is None else v for v in line] for line in grid]
            im = ax.imshow(values, cmap=cmap, vmin=0, vmax=1, aspect="auto")
            for i, line in enumerate(grid):
                for j, v in enumerate(line):
                    ax.text(j, i, "—" if v is None else f"{100 * v:.0f}", ha="center", va="center", fontsize=8)
            ax.set_title(method)
            ax.set_xticks(range(len(lengths)), [format_length(n) for n in lengths])
            ax.set_xlabel("context length (tokens)")
        axes[0][0].set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        axes[0][0].set_ylabel("depth")
        fig.colorbar(im, ax=axes[0].tolist(), label="score (%)", shrink=0.9,
                     format=lambda x, _: f"{100 * x:.0f}")
        fig.suptitle(f"{task}: score (%) by needle depth and context length; grey: not run"
                     f"{' — ' + metrics['model'] if metrics.get('model') else ''}", y=1.04)
        paths.append(_save(fig, out_dir / f"heatmap_{slug(task)}.png"))
    return paths


def versus_length(metrics: dict, out_dir: str | Path, key: str = "score") -> Path | None:
    """One panel per task (plus their mean when there are several): ``key`` (score or recall) vs length, a
    line per method with its 95 % interval as error bars."""
    from .specs import format_length
    plt = _pyplot()
    interval = "ci" if key == "score" else f"{key}_ci"
    panels = {t: {(c["method"], c["length"]): c for c in metrics["by_task"] if c["task"] == t and c[key] is not None}
              for t in metrics["tasks"]}
    if len(panels) > 1:
        panels["mean over tasks"] = {(c["method"], c["length"]): c for c in metrics["by_length"] if c[key] is not None}
    panels = {title: cells for title, cells in panels.items() if cells}
    if not panels:
        return None
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(3.6 * cols, 2.8 * rows))
    colours = {m: f"C{i}" for i, m in enumerate(metrics["methods"])}
    lengths = metrics["lengths"]
    for ax, (title, cells) in zip(axes.flat, panels.items()):
        for i, method in enumerate(metrics["methods"]):
            points = [cells[(method, n)] for n in lengths if (method, n) in cells]
            if not points:
                continue
            x = [c["length"] * 1.07 ** (i - (len(colours) - 1) / 2) for c in points]    # side by side, not on top
            y = [100 * c[key] for c in points]
            bounds = [c.get(interval) or [c[key], c[key]] for c in points]
            err = [[v - 100 * b[0] for v, b in zip(y, bounds)], [100 * b[1] - v for v, b in zip(y, bounds)]]
            ax.errorbar(x, y, yerr=err, marker="o", color=colours[method], label=method, capsize=2)
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [format_length(n) for n in lengths])
        ax.minorticks_off()
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{'gold recall' if key == 'recall' else key} (%)")
    legend = {}
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))   # label -> handle, every method once
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(6, max(1, len(legend))),
               bbox_to_anchor=(0.5, -0.02))
    what = "gold recall of the recomputed tokens" if key == "recall" else "score"
    fig.suptitle(f"{what} vs context length, 95 % intervals{' — ' + metrics['model'] if metrics.get('model') else ''}")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    name = "accuracy_vs_length.png" if key == "score" else f"{key}_vs_length.png"
    return _save(fig, Path(out_dir) / name)


def draw_all(metrics: dict, out_dir: str | Path) -> list[Path]:
    paths = depth_heat_maps(metrics, out_dir)
    for key in ("score", "recall"):
        if (lines := versus_length(metrics, out_dir, key)) is not None:
            paths.append(lines)
    return paths
