"""Summary statistics of timing samples (raw samples come from the worker's stopwatch)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("no samples")
    return statistics.median(samples)


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values; None when there are none."""
    if not values:
        return None
    if any(v <= 0 for v in values):
        raise ValueError(f"geometric mean needs positive values, got {list(values)}")
    return math.exp(sum(math.log(v) for v in values) / len(values))
