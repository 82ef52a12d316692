"""A tensor's fingerprint: taken by the worker as a timed call returns and by the trusted side
later; a difference means the output was still being written. Pure: torch and math only, so
both sides of the boundary import it."""

from __future__ import annotations

import math

import torch

_vector_norm = torch.linalg.vector_norm  # bound before any submission could replace it


def fingerprint(output: object) -> float | None:
    """The L2 norm of a floating-point tensor (NaN where any value is NaN), computed without
    a temporary copy; None for anything else. The worker takes it as a timed call returns;
    the parent takes it again later: a difference means the output was still being written."""
    if type(output) is not torch.Tensor or not output.is_floating_point():
        return None
    return float(_vector_norm(output.detach()))


def same_fingerprint(now: float | None, then: float) -> bool:
    """Equal up to the rounding of a reduction run with another thread count (CPU)."""
    if now is None:
        return False
    if math.isnan(now) or math.isnan(then):
        return math.isnan(now) and math.isnan(then)
    return abs(now - then) <= 1e-5 * max(abs(now), abs(then)) or now == then
