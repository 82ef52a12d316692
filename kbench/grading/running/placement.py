"""Where a run's jobs go: this process's device, every GPU of the host (slots) or a Ray
cluster; not part of the results (verdicts do not depend on it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kbench.grading.jobs import Executor
from kbench.grading.options import Device, Options, OptionsError
from kbench.grading.running.local import LocalExecutor


@dataclass(frozen=True)
class Placement:
    """Where a run's jobs go: not part of its results (verdicts do not depend on it)."""

    executor: str = "local"  # local | ray
    gpus: list[str] | None = None  # --gpus; None: every visible GPU
    cpu_slots: int = 1  # --slots, with --device cpu
    address: str | None = None  # --address, with ray


def executor_for(options: Options, placement: Placement, say: Callable[[str], None],
                 beside_builds: bool = False) -> Executor:
    """The executor a placement asks for; OptionsError names what cannot be.
    ``beside_builds``: one GPU grades in a slot process of its own too (kbench grade), so that
    each submission is graded as its build lands, where this process grades only once every
    build is out (kbench.grading.running.local says why); a session keeps its problems open
    in this process between batches instead."""
    if placement.cpu_slots < 1:
        raise OptionsError(f"--slots {placement.cpu_slots}: expected at least 1")
    several = placement.executor == "ray" or placement.cpu_slots > 1
    if options.device is Device.CPU and several and options.timed:
        # One slot's timing (and kbench's own clock checking it) would run beside another's
        # work on the same cores: a verdict would depend on what ran alongside.
        raise OptionsError("several CPU slots share the host's cores, so their timings would "
                           "disturb each other: add --no-timing, or grade on one slot")
    if placement.executor == "ray":
        from kbench.grading.running.cluster import RayExecutor

        return RayExecutor(options, placement.address, say,
                           placement.cpu_slots if options.device is Device.CPU else None)
    from kbench.grading.running import slots

    chosen = slots.specs(options.device, placement.gpus, placement.cpu_slots)
    if len(chosen) == 1 and (options.device is Device.CPU
                             or placement.gpus is None and not beside_builds):
        return LocalExecutor(options, say)  # in this process: no slot process to start
    return slots.SlotsExecutor(options, chosen, say)
