"""The gather without its pieces (``ReformConfig.min_run``; not in the paper).

REFORM's gather (§3.3) keeps the top-budget tokens of window scores. Where those scores hover at the budget's
cut-off it keeps combs of 1-20-token pieces, and a small reader copies a quoted word from them instead of the
fact it was asked about (SmolLM2 on NIAH, docs/results/pooled-windows-smollm2). Dropping only the pieces and
growing the runs kept keeps as many places as the long runs, each longer (docs/results/whole-runs-smollm2).
"""

from __future__ import annotations

import torch


def whole_runs(scores: torch.Tensor, keep: torch.Tensor, shortest: int, forced: torch.Tensor) -> torch.Tensor:
    """``keep`` (ascending) without its runs shorter than ``shortest`` tokens, their budget spent growing the
    runs kept a token at a time on either side, the best-scoring neighbours first; ``forced`` (a bool mask)
    tokens stay. With no run long enough to grow from, ``keep`` as it is."""
    breaks = (keep[1:] != keep[:-1] + 1).nonzero().flatten() + 1
    runs = [run for run in torch.tensor_split(keep, breaks.tolist()) if run.numel() >= shortest]
    if not runs:
        return keep
    kept = torch.cat(runs + [forced.nonzero().flatten()]).unique()
    while (room := keep.numel() - kept.numel()) > 0:
        gap = kept[1:] != kept[:-1] + 1
        edges = torch.cat([kept[torch.cat([gap.new_ones(1), gap])] - 1, kept[torch.cat([gap, gap.new_ones(1)])] + 1])
        edges = edges[(edges >= 0) & (edges < scores.shape[0])].unique()
        if edges.numel() == 0:
            break
        kept = torch.cat([kept, edges[scores[edges].topk(min(room, edges.numel())).indices]]).sort().values
    return kept
