"""Heat maps of MNR per layer x head for Q, K and V on each task (like REFORM's Figures 2 and 4)."""

from __future__ import annotations

from pathlib import Path

from .select import KINDS, MNRTable


def heat_maps(table: MNRTable, out_dir: str | Path, stem: str = "heads") -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    selected = set(table.info.get("selected", []))
    paths = []
    for task in table.mnr:
        grids = [table.grid(task, k) for k in KINDS]
        vmax = max(float(g.nan_to_num(0).max()) for g in grids)
        fig, axes = plt.subplots(1, 4, figsize=(15, 0.25 * table.n_layers + 2.5),
                                 gridspec_kw={"width_ratios": [table.n_heads, table.n_kv_heads, table.n_kv_heads, 2]})
        for ax, kind, g in zip(axes, KINDS, grids):
            im = ax.imshow(g.numpy(), aspect="auto", cmap="viridis_r", vmin=0, vmax=vmax, origin="lower")
            ax.set_title(f"{kind.upper()} heads")
            ax.set_xlabel("head")
            ax.set_xticks(range(g.shape[1]))
            for layer in range(g.shape[0]):
                for h in range(g.shape[1]):
                    if f"{layer}:{kind}:{h}" in selected:
                        ax.add_patch(plt.Rectangle((h - 0.5, layer - 0.5), 1, 1, fill=False, ec="red", lw=2))
        axes[0].set_ylabel("layer")
        hidden = table.hidden.get(task)
        if hidden:
            axes[3].barh(range(len(hidden)), hidden, color="grey")
            axes[3].set_ylim(-0.5, len(hidden) - 0.5)
            axes[3].set_title("hidden state")
            axes[3].set_xlabel("MNR")
        else:
            axes[3].axis("off")
        fig.colorbar(im, ax=axes[:3].tolist(), label="MNR (lower is better)", shrink=0.8)
        fig.suptitle(f"{table.model}: MNR on {task} ({table.info.get('samples_per_task', '?')} samples of "
                     f"{table.info.get('tokens_per_sample', '?')} tokens; red = selected)")
        path = out_dir / f"{stem}_{task}.png"
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
