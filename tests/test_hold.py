"""The hold's length (kbench.worker.hold.Hold): sized from the latest dispatch times, longer
for a sample that outran it, back to their size after it (the sizing itself runs on any
device; the kernel it launches needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from kbench.worker.hold import Hold


def _hold(warm_up: list[float]) -> Hold:
    hold = Hold(torch.device("cpu"), None)
    hold.fit(warm_up)
    return hold


def test_one_slow_dispatch_is_discarded_and_does_not_lengthen_the_holds_after_it():
    hold = _hold([0.03] * 20)
    assert hold.ms == pytest.approx(0.06)  # twice the warm-up's 90th percentile
    # A dispatch that outran the hold (a page fault, the allocator asking the driver): the
    # sample is discarded and the next one held twice that dispatch, so that it is covered.
    assert not hold.covered(0.5) and hold.ms == pytest.approx(1.0)
    # Once covered, the hold follows the latest dispatches again: before, it stayed at 1 ms
    # for the rest of the round, and an idle probe as long came with every sample.
    assert hold.covered(0.03) and hold.ms == pytest.approx(0.06)


def test_a_call_slow_to_dispatch_again_and_again_keeps_its_hold_long():
    hold = _hold([0.03] * 20)
    for _ in range(4):
        while not hold.covered(0.4):  # every 0.4 ms dispatch needs a hold past 0.5 ms
            pass
    assert hold.ms >= 0.5  # a tenth of the latest dispatches or more: their size
    assert all(hold.covered(0.03) for _ in range(20)) and hold.ms == pytest.approx(0.06)


def test_a_call_that_waits_on_the_device_is_held_the_longest_and_timed_as_it_is():
    hold = _hold([0.03] * 20)
    dispatch = 0.05
    while not hold.covered(dispatch):
        dispatch = hold.ms + 0.01  # it waits for the hold (and its own work) as it is queued
    assert hold.ms == Hold.MAX_MS
    assert hold.covered(Hold.MAX_MS + 1) and hold.ms == Hold.MAX_MS
