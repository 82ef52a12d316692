"""How a run splits the host's cores between timing and builds. Builds are the heaviest work a
batch puts on the host (one nvcc chain a core, for minutes); a kernel timed beside them on the
same cores would be timed late, and kbench's own clock would read the lateness as hidden work.
So on a GPU host each evaluation slot keeps a few cores of its own (its grading processes are
pinned there: CPU affinity, inherited by every worker it starts) and builds run on the rest.
On the CPU device timing needs every core: nothing is split, builds run at low priority, and a
timed run builds everything before it times anything (kbench.grading.running.local)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from kbench.grading.options import Device

TIMING_CORES_PER_SLOT = 2  # the slot's trusted process and the worker it times (or the pool's)
# Builds that share cores with timing yield to it. On cores of their own they run at the host's
# usual priority: nothing timed is there to protect, and at nice 10 beside other users' work
# (32 busy processes on a 16-core H200 host) a cached build's import took 121 s, the grade's
# bound (docs/evidence/h200-2026-12-02-issue52-bundled).
SHARED_NICE = 10
OWN_CORES_NICE = 0


@dataclass(frozen=True)
class HostSplit:
    timing: tuple[tuple[int, ...], ...]  # each slot's cores; () for a slot not pinned
    build: tuple[int, ...]  # the cores builds run on
    build_jobs: int  # builds at a time
    nice: int = SHARED_NICE

    @property
    def split(self) -> bool:
        return any(self.timing)

    def cores_per_build(self) -> int:
        """The cores one build may use (MAX_JOBS): an extension's .cu and .cpp compile side by
        side, so two, or more where builds are fewer than cores."""
        return max(2, len(self.build) // max(1, self.build_jobs))

    def describe(self) -> str:
        build = f"builds: {self.build_jobs} at a time on {_cores(self.build)} at nice {self.nice}"
        if not self.split:
            return f"host not split (timing shares every core); {build}"
        slots = "; ".join(f"slot {i}: {_cores(c)}" for i, c in enumerate(self.timing))
        return f"timing on cores of their own ({slots}); {build}"

    def to_dict(self) -> dict:
        return {**asdict(self), "text": self.describe()}


def plan(slots: int, device: Device, build_jobs: int | None,
         cores: list[int] | None = None) -> HostSplit:
    """Each GPU slot its own cores where at least half the host is left to build on; else
    (or on the CPU device) nothing split. ``build_jobs`` (``--build-jobs``) defaults to one
    build per build core."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    reserved = slots * TIMING_CORES_PER_SLOT
    if device is not Device.CUDA or len(cores) < 2 * reserved:
        return unsplit(slots, build_jobs, cores)
    timing = tuple(tuple(cores[i * TIMING_CORES_PER_SLOT:(i + 1) * TIMING_CORES_PER_SLOT])
                   for i in range(slots))
    build = tuple(cores[reserved:])
    return HostSplit(timing, build, build_jobs or len(build), OWN_CORES_NICE)


def unsplit(slots: int, build_jobs: int | None, cores: list[int] | None = None) -> HostSplit:
    """Nothing pinned: where kbench does not own the host's cores (a Ray worker: Ray places
    its tasks) or they are too few to split."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    return HostSplit(tuple(() for _ in range(slots)), tuple(cores), build_jobs or len(cores))


def _cores(cores: tuple[int, ...]) -> str:
    """``0-7``, ``8-63``, or a list where they are not consecutive."""
    if not cores:
        return "no cores"
    if list(cores) == list(range(cores[0], cores[-1] + 1)):
        return f"core {cores[0]}" if len(cores) == 1 else f"cores {cores[0]}-{cores[-1]}"
    return "cores " + ",".join(map(str, cores))
