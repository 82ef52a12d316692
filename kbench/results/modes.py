"""The modes a run is graded under, each named and defaulted once: kbench.grading.options builds
the user's options on them, and a stored run is read with them (a run stored before a mode
existed was graded under that mode's default, as the kbench that stored it did)."""

from __future__ import annotations

from enum import Enum


class TimingMode(str, Enum):
    EAGER = "eager"  # one call per sample, launch costs included
    GRAPH = "graph"  # CUDA-graph replays of many calls (kbench.worker.timing)


class Rules(str, Enum):
    """Whose correctness rules decide the verdict that ranks (both are reported for
    KernelBench problem files; kbench.grading.checking.kernelbench_rules)."""

    KBENCH = "kbench"  # many sizes and draws, float64 truth, cheat checks
    KERNELBENCH = "kernelbench"  # the problem's own sizes and seeds, allclose, 5 trials


class Profile(str, Enum):
    FULL = "full"  # every round and sample the task asks for, and the torch.compile baseline
    QUICK = "quick"  # for screening thousands: fewer rounds, samples and fresh processes


DEFAULT_TIMING = TimingMode.EAGER
DEFAULT_RULES = Rules.KBENCH
DEFAULT_PROFILE = Profile.FULL
