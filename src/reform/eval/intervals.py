"""95 % intervals for the eval tables: Wilson score intervals for rates (every value 0 or 1), a
percentile bootstrap for partial-credit scores (RULER's fraction of gold strings), stratified by task when
a cell averages several tasks. With a handful of rows per cell the intervals are wide; they say how far a
single miss can move a number."""

from __future__ import annotations

import math
import random
from typing import Sequence

Z95 = 1.959963984540054
RESAMPLES = 2000


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a rate ``successes / n`` (n >= 1)."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(groups: Sequence[Sequence[float]], level: float = 0.95, resamples: int = RESAMPLES,
              seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of the groups' means, resampling rows within each group
    (one group: the plain bootstrap of a mean). Seeded, so a report is reproducible."""
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        means.append(sum(sum(rng.choices(g, k=len(g))) / len(g) for g in groups) / len(groups))
    means.sort()
    tail = (1 - level) / 2
    return means[int(tail * (resamples - 1))], means[math.ceil((1 - tail) * (resamples - 1))]


def interval(groups: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """95 % interval of the mean of ``groups``' means: Wilson when every value is 0 or 1 (over all rows,
    at the mean of means), else the bootstrap. Rows that do not vary (one row per cell, say) give the
    bootstrap nothing to resample, so then the Wilson interval at the mean stands in: as wide as a rate's
    on as many rows. None when there are no values."""
    groups = [list(g) for g in groups if len(g)]
    if not groups:
        return None
    n = sum(map(len, groups))
    mean = sum(sum(g) / len(g) for g in groups) / len(groups)
    if all(v in (0, 1) for g in groups for v in g) or all(len(set(g)) == 1 for g in groups):
        return wilson(mean * n, n)
    return bootstrap(groups)
