"""Outputs of timed calls kept for the trusted side to verify, and the clocked pass it times
on its own clock."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import torch

Inputs = Callable[[int], list]  # call index -> a fresh input set, values never seen before

_synchronize = torch.cuda.synchronize  # bound before any submission is imported


class Kept:
    """Outputs of timed calls held back for the trusted side to verify: the latest ``ring``
    (holding them also makes each new output land at another address) and one earlier call,
    picked uniformly at random with the OS's randomness after it returned (reservoir
    sampling), so no call can know whether its output will be looked at. With each output,
    its ``fingerprint`` as it was returned."""

    def __init__(self, ring: int) -> None:
        self.ring = ring
        self.latest: dict[int, tuple[object, float | None]] = {}
        self.early: tuple[int, tuple[object, float | None]] | None = None
        self.evicted = 0

    def make_room(self) -> None:
        """Before a call: retire the oldest of the latest, so its memory can be reused."""
        while len(self.latest) >= self.ring:
            index = next(iter(self.latest))
            kept = self.latest.pop(index)
            self.evicted += 1
            if secrets.randbelow(self.evicted) == 0:
                self.early = (index, kept)

    def add(self, index: int, output: object, norm: float | None) -> None:
        self.latest[index] = (output, norm)

    def outputs(self) -> dict[int, tuple[object, float | None]]:
        """Call index -> (output, its fingerprint when returned)."""
        return {**({self.early[0]: self.early[1]} if self.early else {}), **self.latest}


# Outputs a clocked pass holds at once: the one kept at random, the latest, the call's new one.
HELD_BY_A_PASS = 3


def clocked(call: Callable[[list], object], inputs: Inputs, calls: int, device: torch.device
            ) -> dict[int, tuple[object, float | None]]:
    """``calls`` calls on ``inputs(i)``, back to back, each followed by a device-wide
    synchronisation, with no hold and no flush: the pass the trusted side times on its own
    clock (see kbench.grading.timing.integrity). Returns the outputs kept for verification, by
    call index."""
    kept = Kept(1)
    for index in range(calls):
        kept.make_room()
        output = call(inputs(index))
        if device.type == "cuda":
            _synchronize()
        kept.add(index, output, None)
    return kept.outputs()
