"""The trusted side of timing: summarise the samples a worker sent, divide them.

The samples were checked as they were decoded (kbench.shared.protocol.Samples.from_wire): a worker's
answer is data from a process that may run candidate code. Medians and intervals come from
kbench.shared.stats.
"""

from __future__ import annotations

import math
import statistics

from kbench.results.run_record import Benchmark, Measurement, SubmissionResult
from kbench.shared import stats
from kbench.shared.protocol import ClockedPass, Samples

# Work a call leaves on other streams is charged to it when the device stays busy after the
# call's stream is done beyond what a probe with no side work sees right after the call: the
# least of each over the samples, taken apart (the calls' less the probes'), for longer than
# this and longer than this share of the call; below that it is indistinguishable from the
# host's synchronisation jitter. Each reading is the side work plus the host thread's wake-up
# (see kbench.worker.hold), which a busy host only lengthens, so neither least is below what
# it measures, however many samples were delayed. A lower quartile of per-sample differences
# failed there: on an H200 beside 32 busy processes, wake-ups of milliseconds hid the side
# work of a call whose work all ran on a private stream (2.9x, its honest twin 0.77x).
SIDE_WORK_MS = 0.03
SIDE_WORK_SHARE = 0.1
# Charged side work this large is not jitter but a call that returns before its output is
# ready (the grader flags it); the margin keeps honest calls clear of the host's wake-up noise.
UNORDERED_MS = 0.05
UNORDERED_SHARE = 0.25


def summarise(rounds: list[Samples], nbytes: int | None) -> Measurement:
    """One Measurement over one or more checked rounds of samples of the same thing.

    ``nbytes`` is the traffic one call must move at least (for GB/s); None for no GB/s.
    """
    ms = [v for r in rounds for v in r.ms]
    after = [a - i for r in rounds for a, i in zip(r.after_ms, r.idle_ms, strict=True)]
    side = min(a for r in rounds for a in r.after_ms) - min(i for r in rounds for i in r.idle_ms)
    charged = side > max(SIDE_WORK_MS, SIDE_WORK_SHARE * statistics.median(ms))
    if charged:  # each sample at least the side work seen at best
        ms = [v + max(side, a) for v, a in zip(ms, after, strict=True)]
    est = stats.estimate(ms)
    max_sm = [r.max_sm_mhz for r in rounds if _number(r.max_sm_mhz)]
    return Measurement(
        ms=est.median, ci=[est.low, est.high], samples=est.samples,
        gbps=nbytes / (est.median * 1e-3) / 1e9 if nbytes else None,
        side_work_ms=side if charged else None,
        host_ms=statistics.median(v for r in rounds for v in r.host_ms), fastest_ms=min(ms),
        sm_mhz=_median([v for r in rounds for v in r.sm_mhz]),
        mem_mhz=_median([v for r in rounds for v in r.mem_mhz]),
        max_sm_mhz=max_sm[0] if max_sm else None,
        slowed=sum(1 for r in rounds for v in r.slowed if v is True),
        l2_reset=all(r.persisting_l2_reset is not False for r in rounds),
        exclusive_hold=_all_true([r.exclusive_hold for r in rounds]))


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _all_true(flags: list) -> bool | None:
    """True if every flag is True, False if one is False, None if none was recorded."""
    if any(f is False for f in flags):
        return False
    return True if any(f is True for f in flags) else None


def _median(values: list) -> float | None:
    numbers = [v for v in values if _number(v)]
    return statistics.median(numbers) if numbers else None


def estimate(m: Measurement) -> stats.Estimate:
    return stats.Estimate(m.ms, m.ci[0], m.ci[1], m.samples)


def drift(start: Measurement, end: Measurement) -> str | None:
    """Why the reference timed at the start and at the end of a run disagree (their
    intervals are disjoint: the machine drifted), or None."""
    if not stats.disagree(estimate(start), estimate(end)):
        return None
    return (f"start {start.ms:.4g} ms ({start.ci[0]:.4g}-{start.ci[1]:.4g}), end {end.ms:.4g} "
            f"ms ({end.ci[0]:.4g}-{end.ci[1]:.4g}): {100 * (end.ms / start.ms - 1):+.1f}%")


def add_speedups(result: SubmissionResult, reference: list[Benchmark],
                 loaded: bool = False) -> None:
    """Per shape: reference median / candidate median, over the eager reference timed in
    rounds alongside the candidate and over torch.compile of it, each with an interval;
    overall: geometric means over the timed shapes. A shape whose reference could not be
    timed alongside gets no speedup (its ``skipped`` says why) rather than one over the
    run's start-of-run reference: a speedup always divides the same kind of figure.
    ``loaded``: the stopwatch was host time on a host other processes kept busy meanwhile
    (see _loaded)."""
    for bench in result.benchmarks:
        if bench.candidate is not None and bench.reference is not None:
            bench.speedup, *bench.speedup_ci = stats.ratio(estimate(bench.reference),
                                                           estimate(bench.candidate))
            if loaded:
                bench.speedup_ci = _loaded(bench.speedup_ci, bench.reference, bench.candidate)
    timed = [b for b in result.benchmarks if b.candidate is not None]
    result.speedup, result.speedup_ci = _overall([(b.speedup, b.speedup_ci) for b in timed])
    add_compile_speedups(result, reference)


def _loaded(ci: list[float], ref: Measurement, mine: Measurement) -> list[float]:
    """A speedup's interval on a loaded host, widened to cover each side's fastest call over
    the other's median. Load stretches host time by as much as it happens to hit each side,
    and no interval over the samples bounds that: on a 2-core machine at load average 7, a
    copy of the reference's own expression got 0.453x (0.362-0.588) while the fastest calls of
    the two sides were 1.80 and 1.84 ms. Each side's fastest call is the least slowed, so the
    true ratio lies between the fastest over the other's median, either way round."""
    if not (ref.fastest_ms and mine.fastest_ms):
        return ci
    return [min(ci[0], ref.fastest_ms / mine.ms), max(ci[1], ref.ms / mine.fastest_ms)]


def add_compile_speedups(result: SubmissionResult, reference: list[Benchmark]) -> bool:
    """Per shape and overall, over torch.compile of the reference where ``reference`` has it
    timed (it may come after the submission's timing: kbench.grading.timing.compiled);
    whether any was added."""
    added = False
    for bench, ref in zip(result.benchmarks, reference, strict=True):
        if bench.candidate is not None and ref.compiled is not None:
            bench.compile_speedup, *bench.compile_speedup_ci = stats.ratio(
                estimate(ref.compiled), estimate(bench.candidate))
            added = True
    timed = [b for b in result.benchmarks if b.candidate is not None]
    result.compile_speedup, result.compile_speedup_ci = _overall(
        [(b.compile_speedup, b.compile_speedup_ci) for b in timed])
    return added


def _overall(pairs: list[tuple[float | None, list[float] | None]]
             ) -> tuple[float | None, list[float] | None]:
    """Geometric mean of per-shape speedups and of their bounds; None unless every shape has
    one (a mean over some shapes would not compare with a mean over all)."""
    if not pairs or any(value is None for value, _ in pairs):
        return None, None
    return (stats.geomean([v for v, _ in pairs]),
            [stats.geomean([ci[k] for _, ci in pairs]) for k in (0, 1)])


def less_waits(trip_s: float, answer: ClockedPass) -> float:
    """A clocked pass's round trip less the device waits its worker says it spun in the calls'
    place (kbench.worker.hold.DeviceWait): a figure that is no number, or negative, takes out
    nothing (a worker overstating its waits only lengthens the difference kbench's clock reads)."""
    ms = answer.waited_ms
    return trip_s - (ms / 1e3 if math.isfinite(ms) and ms > 0 else 0.0)
