"""Statistics of timing samples: medians with confidence intervals, ratios and their means.

Timing noise is skewed (a preempted call is slow, never fast), so kbench reports medians, and
their intervals come from order statistics, which assume no distribution.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A median and its distribution-free 95 % confidence interval, in the samples' unit."""

    median: float
    low: float
    high: float
    samples: int

    @property
    def rel_halfwidth(self) -> float:
        """Half the interval's width over the median: the relative precision reached."""
        return (self.high - self.low) / 2 / self.median


def estimate(samples: Sequence[float]) -> Estimate:
    """The median and the order statistics that bracket it with 95 % confidence.

    Ranks j and k (1-based) are n/2 -/+ 1.96 sqrt(n)/2, the normal approximation to the
    binomial(n, 1/2) count of samples below the true median; with fewer than 6 samples the
    interval is the whole range.
    """
    if not samples:
        raise ValueError("no samples")
    xs = sorted(samples)
    n = len(xs)
    half = _Z95 * math.sqrt(n) / 2
    j = max(1, math.floor(n / 2 - half))
    k = min(n, math.ceil(n / 2 + 1 + half))
    return Estimate(statistics.median(xs), xs[j - 1], xs[k - 1], n)


def converged(samples: Sequence[float], target: float) -> bool:
    """True once the median's interval half-width is within ``target`` (relative)."""
    return estimate(samples).rel_halfwidth <= target


def ratio(numerator: Estimate, denominator: Estimate) -> tuple[float, float, float]:
    """A speedup and an interval that holds whenever both medians lie in their intervals."""
    return (numerator.median / denominator.median, numerator.low / denominator.high,
            numerator.high / denominator.low)


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values; None when there are none."""
    if not values:
        return None
    if any(v <= 0 for v in values):
        raise ValueError(f"geometric mean needs positive values, got {list(values)}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def disagree(a: Estimate, b: Estimate) -> bool:
    """True when two medians differ by more than their noise: their 95 % intervals are
    disjoint (the test kbench uses for drift between two timings of the same thing)."""
    return a.high < b.low or b.high < a.low
