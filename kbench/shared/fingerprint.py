"""An output's fingerprint: taken by the worker as a timed call returns and by the trusted side
later; a difference means the output was still being written. Pure: torch, math and
kbench.shared.outputs only, so both sides of the boundary import it."""

from __future__ import annotations

import math

import torch

from kbench.shared.outputs import Unsupported, flatten

_vector_norm = torch.linalg.vector_norm  # bound before any submission could replace it
_sum = torch.sum
_split = torch.split
_CHUNK = 1 << 22  # integer values summed this many at a time: a bounded int64 temporary


def fingerprint(output: object) -> float | None:
    """The L2 norm over every value of an output (a tensor, numbers, or a tuple or list of
    them; NaN where any value is NaN; an integer tensor counts by its sum), read without a
    temporary copy; None for anything else."""
    try:
        leaves, _ = flatten(output)
    except Unsupported:
        return None
    squares = 0.0
    for leaf in leaves:
        if type(leaf) is not torch.Tensor:
            norm = abs(float(leaf))
        elif leaf.is_floating_point():
            norm = float(_vector_norm(leaf.detach()))
        else:  # integers and bools: their sum, widened to int64 a chunk at a time
            norm = abs(float(sum(int(_sum(part, dtype=torch.int64))
                                 for part in _split(leaf.detach().reshape(-1), _CHUNK))))
        squares += norm * norm
    return math.sqrt(squares)


def same_fingerprint(now: float | None, then: float) -> bool:
    """Equal up to the rounding of a reduction run with another thread count (CPU)."""
    if now is None:
        return False
    if math.isnan(now) or math.isnan(then):
        return math.isnan(now) and math.isnan(then)
    return abs(now - then) <= 1e-5 * max(abs(now), abs(then)) or now == then


def weight_sums(tensor: torch.Tensor) -> list[float]:
    """Checksums of a parameter or buffer: its sum, its sum of squares and a sum weighted by
    position (the same values in another order differ there), in float64."""
    flat = tensor.detach().reshape(-1).to(torch.float64)
    where = torch.arange(flat.numel(), device=flat.device, dtype=torch.float64)
    return [float(flat.sum()), float(flat.pow(2).sum()),
            float((flat * torch.cos(where)).sum())]


def same_weights(mine: list[float], theirs: list[float]) -> bool:
    """Checksums of the same values, up to the rounding of a sum on another device."""
    return all(abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b)) or (a != a and b != b)
               for a, b in zip(mine, theirs, strict=True))
