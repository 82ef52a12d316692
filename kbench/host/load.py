"""How busy the host was over a stretch of time, kbench's own processes there left out: the
load that can preempt a timing's host threads (kbench.grading.timing.disturbance). Read from the
kernel's CPU counters at both ends, so a burst between two readings counts in full."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

# The host counts as disturbed when other processes kept at least this many cores busy, and
# at least this share of all cores, on average over the stretch: a timing's own threads need
# one core each, and half a core's worth of other work preempts them now and then. (At one
# core, two busy loops on a 2-core machine, sharing it with kbench's own busy processes, read
# 0.97: a quiet host, where the clock's flags on honest baselines stood, 2026-12-02.)
BUSY_CORES = 0.5
BUSY_SHARE = 0.1


@dataclass(frozen=True)
class Reading:
    """The host over one stretch: its wall seconds, the cores other processes kept busy on
    average, the 1-minute load average at its end and the host's core count."""

    seconds: float
    other_busy_cores: float
    load_avg: float | None
    cores: int

    @property
    def disturbed(self) -> bool:
        return self.other_busy_cores >= max(BUSY_CORES, BUSY_SHARE * self.cores)

    def text(self) -> str:
        load = f", load average {self.load_avg:.2f}" if self.load_avg is not None else ""
        return (f"other processes kept {self.other_busy_cores:.1f} of {self.cores} cores "
                f"busy over {self.seconds:.1f} s{load}")


class Meter:
    """Started at construction; ``read`` says how busy the host was since, less what this
    process and its descendants (workers, their fresh rounds) used."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.host = _host_busy()
        self.own = _own()

    def read(self) -> Reading:
        seconds = max(1e-6, time.monotonic() - self.start)
        host = _host_busy() - self.host
        own = _own()
        used = sum(total - self.own.get(pid, 0.0) for pid, total in own.items())
        # A descendant that ended meanwhile was reaped into its parent's children_* counters,
        # its whole life with it: take back the part it had used before the stretch.
        used -= sum(total for pid, total in self.own.items() if pid not in own)
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = None
        return Reading(seconds, max(0.0, host - used) / seconds, load,
                       psutil.cpu_count() or 1)


def _host_busy() -> float:
    """CPU seconds the whole host has spent busy since boot (every core)."""
    t = psutil.cpu_times()  # guest time is inside user and nice already; steal is not ours
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


def _own() -> dict[tuple[int, float], float]:
    """CPU seconds of this process and each descendant, reaped children included, keyed by
    pid and start time (a pid reused meanwhile is another process)."""
    me = psutil.Process()
    seen: dict[tuple[int, float], float] = {}
    for proc in [me, *_children(me)]:
        try:
            with proc.oneshot():
                t = proc.cpu_times()
                seen[(proc.pid, proc.create_time())] = (t.user + t.system + t.children_user
                                                        + t.children_system)
        except psutil.Error:
            continue
    return seen


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []
