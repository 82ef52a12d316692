"""Which of a problem's sizes may vary, over which ranges, and how small a CPU run makes them.

kbench proposes; a task YAML's ``sizes`` overrides. A size varies when it looks like an extent
(8 or more; a batch size from 2) and the reference still runs, on the meta device, with it set
to an odd value below the file's; where an odd value breaks it, a multiple of the largest
power of two (up to 64) dividing the file's value is tried; where that breaks it too, the size
stays fixed. On a CPU, sizes halve, largest first, until one call's work is within a bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import ModuleType

from torch.utils.flop_counter import FlopCounterMode

from kbench.problems.trial import TrialError, Work, on_meta
from kbench.shared import inputs

# One correctness call on a CPU stays within these (float64 reference included, a few seconds
# at most on two cores); sizes the reference needs as they are can keep a problem above them.
CPU_MAX_FLOPS = 2e8
CPU_MAX_BYTES = 16 << 20
# A reference slower than this on the meta device (a recurrent network unrolled op by op) is
# not tried at other sizes: its sizes vary unchecked, a random case that breaks it is dropped
# when the problem is screened on the device (kbench.grading.checking.screen), and the CPU shrink
# assumes one call's work grows with the product of the sizes.
SLOW_TRIAL_S = 1.0


@dataclass(frozen=True)
class Range:
    """Values a size takes in random cases: multiples of ``step`` in [lo, hi]."""

    lo: int
    hi: int
    step: int = 1


@dataclass
class SizePlan:
    own: dict[str, int]  # the file's sizes: always a case, and the default benchmark
    ranges: dict[str, Range]  # sizes that vary (the rest stay at ``own``)
    cpu_own: dict[str, int]  # ``own`` shrunk to the CPU bound
    cpu_ranges: dict[str, Range]
    checked: bool  # random sizes are checked on the meta device before they are used
    cpu_heavy: bool = False  # over the CPU bound even shrunk: fewer random cases there
    notes: list[str] = field(default_factory=list)

    def for_device(self, device: str) -> tuple[dict[str, int], dict[str, Range]]:
        return (self.cpu_own, self.cpu_ranges) if device == "cpu" else (self.own, self.ranges)


def _looks_variable(name: str, value: int) -> bool:
    return value >= 8 or ("batch" in name.lower() and value >= 2)


def _runs(module: ModuleType, params: dict[str, int], eval_mode: bool) -> Work | None:
    try:
        return on_meta(module, params, eval_mode=eval_mode)
    except TrialError:
        return None


def _step_for(module: ModuleType, own: dict[str, int], name: str, eval_mode: bool) -> int | None:
    """The step a size can vary in (1 for any value), or None if it cannot vary."""
    value = own[name]
    odd = max(1, (value * 3) // 5) | 1
    if odd < value and _runs(module, {**own, name: odd}, eval_mode):
        return 1
    for step in (2, 4, 8, 16, 32, 64):
        if value % step:
            break
        trial = max(step, (value * 3 // 5) // step * step)
        if trial < value and _runs(module, {**own, name: trial}, eval_mode):
            return step
    return None


def plan(module: ModuleType, overrides: dict[str, Range | int], eval_mode: bool) -> SizePlan:
    """Sizes, ranges and the CPU shrink for a problem module. ``overrides`` (from a task
    YAML) fixes a size to a value or gives its range; every other size is proposed here."""
    own = inputs.own_sizes(module)
    for name, given in overrides.items():
        if isinstance(given, int):
            own[name] = given
    notes: list[str] = []
    _warm_up()
    start = time.monotonic()
    try:
        base = on_meta(module, own, eval_mode=eval_mode)
    except TrialError as exc:
        fixed = [n for n in own if n not in overrides]
        if fixed:
            notes.append(f"sizes kept as the file sets them ({', '.join(fixed)}): the "
                         f"reference does not run on the meta device ({exc})")
        ranges = {n: r for n, r in overrides.items() if isinstance(r, Range)}
        return SizePlan(own, ranges, dict(own), dict(ranges), checked=False, notes=notes)
    slow = time.monotonic() - start > SLOW_TRIAL_S
    ranges: dict[str, Range] = {}
    fixed = []
    for name, value in own.items():
        given = overrides.get(name)
        if isinstance(given, Range):
            ranges[name] = given
            continue
        if given is not None or not _looks_variable(name, value):
            continue
        step = 1 if slow else _step_for(module, own, name, eval_mode)
        if step is None:
            fixed.append(name)
            continue
        ranges[name] = Range(max(step, value // 16 // step * step), value, step)
    if fixed:
        notes.append(f"sizes kept as the file sets them ({', '.join(fixed)}): the reference "
                     "does not run with other values")
    if slow:
        notes.append(f"the reference takes over {SLOW_TRIAL_S:g} s on the meta device: its "
                     "sizes vary unchecked there (a case that breaks it is dropped when the "
                     "problem is screened)")
    trial = _estimate(own, base) if slow else \
        (lambda params: _runs(module, params, eval_mode))
    cpu_own, cpu_ranges, heavy = _shrink(trial, own, ranges, base, notes, fixed)
    return SizePlan(own, ranges, cpu_own, cpu_ranges, checked=not slow, cpu_heavy=heavy,
                    notes=notes)


_warm: list[bool] = []


def _warm_up() -> None:
    """The first meta call in a process pays for torch's lazy set-up: not the problem's."""
    if not _warm:
        import torch
        with torch.device("meta"), FlopCounterMode(display=False):
            torch.nn.Conv2d(3, 4, 3)(torch.nn.Linear(8, 8)(torch.empty(2, 3, 8, 8)))
        _warm.append(True)


def _estimate(own: dict[str, int], base: Work):
    """One call's work at other sizes, assumed to grow with the product of the sizes."""
    def work(params: dict[str, int]) -> Work:
        scale = math.prod(params[n] / own[n] for n in own if own[n] > 0)
        return Work(int(base.flops * scale), int(base.bytes * scale),
                    int(base.input_bytes * scale), int(base.output_bytes * scale))
    return work


def _over(work: Work) -> bool:
    return work.flops > CPU_MAX_FLOPS or work.input_bytes + work.output_bytes > CPU_MAX_BYTES


def _shrink(trial, own: dict[str, int], ranges: dict[str, Range], work: Work,
            notes: list[str], fixed: list[str] = ()
            ) -> tuple[dict[str, int], dict[str, Range], bool]:
    """While one call is over the CPU bound, halve (to a multiple of its step) the varying
    size furthest above the bottom of its range; a size whose halving breaks the reference,
    or cuts the work by less than a tenth, stays where it is from then on. Still over, a
    size the reference allows no other value for is tried at 1 (broadcasting often allows
    that one), the largest first."""
    sizes = dict(own)
    stuck: set[str] = set()
    while _over(work):
        movable = [n for n in ranges if n not in stuck and sizes[n] > ranges[n].step]
        if not movable:
            work = _to_one(trial, sizes, fixed, work)
            break
        name = max(movable, key=lambda n: (sizes[n] / ranges[n].lo, sizes[n]))
        step = ranges[name].step
        smaller = max(step, sizes[name] // 2 // step * step)
        after = trial({**sizes, name: smaller})
        if after is None or _cost(after) > 0.9 * _cost(work):
            stuck.add(name)
            continue
        sizes[name], work = smaller, after
    if _over(work):
        notes.append(f"on a CPU one call still does {work.flops:.3g} FLOPs and moves "
                     f"{(work.input_bytes + work.output_bytes) / 2**20:.0f} MiB at the "
                     "smallest sizes the reference allows")
    cpu_ranges = {n: Range(max(r.step, sizes[n] // 8 // r.step * r.step), sizes[n], r.step)
                  for n, r in ranges.items()}
    return sizes, cpu_ranges, _over(work)


def _to_one(trial, sizes: dict[str, int], fixed: list[str], work: Work) -> Work:
    """``sizes`` with fixed sizes set to 1 where the reference still runs (in place), while
    one call is over the CPU bound; the work at the sizes kept."""
    for name in sorted(fixed, key=lambda n: -sizes[n]):
        if not _over(work):
            break
        after = trial({**sizes, name: 1})
        if after is not None:
            sizes[name], work = 1, after
    return work


def _cost(work: Work) -> float:
    return max(work.flops / CPU_MAX_FLOPS, (work.input_bytes + work.output_bytes) / CPU_MAX_BYTES)


def valid(module: ModuleType, params: dict[str, int], eval_mode: bool) -> bool:
    """Does the reference run at these sizes (on the meta device)?"""
    return _runs(module, params, eval_mode) is not None
