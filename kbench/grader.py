"""The entry to grading: a run (kbench.grading.running.driver) on this machine's device
(kbench.grading.running.local.LocalExecutor), on every GPU of the host
(kbench.grading.running.slots) or on a Ray cluster (kbench.grading.running.cluster). The stages live
in kbench.grading; the map is docs/architecture.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kbench.grading.jobs import Executor
from kbench.grading.options import Device, Options, OptionsError
from kbench.grading.running import driver
from kbench.grading.running.local import LocalExecutor
from kbench.results.store import Store


@dataclass(frozen=True)
class Placement:
    """Where a run's jobs go: not part of its results (verdicts do not depend on it)."""

    executor: str = "local"  # local | ray
    gpus: list[str] | None = None  # --gpus; None: every visible GPU
    cpu_slots: int = 1  # --slots, with --device cpu
    address: str | None = None  # --address, with ray


def executor_for(options: Options, placement: Placement, say: Callable[[str], None]
                 ) -> Executor:
    """The executor a placement asks for; OptionsError names what cannot be."""
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
    if len(chosen) == 1 and (options.device is Device.CPU or placement.gpus is None):
        return LocalExecutor(options, say)  # in this process: no slot process to start
    return slots.SlotsExecutor(options, chosen, say)


def grade(label: str, plan: driver.Plan, options: Options, store: Store,
          run_id: int | None = None, force: bool = False,
          on_result: driver.Progress = lambda r, i, n: None,
          say: Callable[[str], None] = lambda line: None,
          placement: Placement = Placement()) -> int:
    """Grade each problem's submissions into ``store`` as run ``label``; returns the run's id.
    Raises CaseError for a ``--case`` the plan does not have, StoreError for a run another
    process grades, OptionsError for a placement that cannot be."""
    executor = executor_for(options, placement, say)
    executor.watch_store(store.presence)
    return driver.grade(label, plan, options, executor, store, run_id, force, on_result, say)
