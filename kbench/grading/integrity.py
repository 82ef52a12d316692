"""Checks that timed figures are honest: outputs of timed calls verified, kbench's own clock
against the submission's figures, work left on other streams, and achieved bandwidth against
the copy bandwidth measured in the same run. Each failure is a Stop, mostly flagged."""

from __future__ import annotations

import math
import random
import time

import torch

from kbench import measurement, protocol
from kbench.compare import compare_in_chunks
from kbench.fingerprint import fingerprint, same_fingerprint
from kbench.grading.channel import Channel, Stop
from kbench.grading.context import Context
from kbench.grading.options import TimingMode
from kbench.grading.reference_pool import ReferenceWorker
from kbench.results import Benchmark, Measurement, params_text
from kbench.task import Params
from kbench.verdict import Status, Verdict

_random = random.SystemRandom()  # choices a submission must not be able to predict

# Outputs of timed calls verified per round: the two latest and others picked at random.
_VERIFIED = 8

# A submission whose achieved bandwidth (the task's minimum bytes over its median time) beats
# the copy bandwidth measured in the same run by more than this factor did not move those
# bytes: it skipped work while timed (replayed, cached or left out the computation).
_MAX_COPY_SHARE = 1.5

# The trusted clock (see trusted_clock): passes of as many calls as the median says fill
# _CLOCKED_MS (within 1 and _CLOCKED_MAX_CALLS), so the round trip's noise is small beside
# them, until one is explained or _CLOCKED_PASSES are spent. The median plus host dispatch
# must explain a pass's time per call within this share of the median plus this many ms
# (wider on a CPU, where a pass of warm calls and the cold timed ones differ more), plus what
# the trusted control shows the host's contention adds at that moment.
_CLOCKED_PASSES = 6
_CLOCKED_MS = 20.0
_CLOCKED_MAX_CALLS = 2000
_CLOCK_SLACK = {"cuda": (0.15, 0.1), "cpu": (0.5, 1.0)}


def verify(ctx: Context, channel: Channel, params: Params, kept: list[int]) -> None:
    """Outputs of timed calls, checked like a case's: the two latest and others picked here at
    random among those the worker kept (see kbench.worker.kept), against the reference on the
    same inputs, drawn again here from the seeds the worker used. The comparison is with the
    reference in the benchmark dtype at twice the task's tolerance: it is there to catch
    outputs not computed from these inputs. An output whose fingerprint differs from the one
    taken as its call returned was still being written: flagged."""
    stage = f"benchmark {params_text(params)}"
    kept = sorted(set(kept))
    chosen = kept[-2:] + _random.sample(kept[:-2], min(len(kept) - 2, _VERIFIED - 2)) \
        if len(kept) > 2 else kept
    answer = channel.call(protocol.Outputs(chosen), ctx.task.limits.case_s, stage)
    items = answer.outputs
    if sorted(i.call for i in items) != sorted(chosen):
        raise Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker did not send the kept "
                           "outputs asked for (was kbench's worker code changed in the "
                           "submission's process?)"))
    dtype = ctx.task.benchmark_dtype
    loose = ctx.task.tolerance[dtype].scaled(2)
    for item in items:
        where = f"{stage}: timed call {item.call}"
        if item.outputs is None:
            raise Stop(Verdict(Status.WRONG_OUTPUT, f"{where} returned {item.structure}, "
                               "expected tensors or numbers"))
        inputs = ctx.draw(params, dtype, ctx.distribution, item.seed)
        expected = ctx.expected(params, dtype, inputs, exact=False)
        del inputs
        if item.norm is not None and not same_fingerprint(fingerprint(item.outputs), item.norm):
            raise Stop(Verdict(Status.FLAGGED, f"{where}: the output changed after the call "
                               "returned (it was still being written)"))
        outcome = compare_in_chunks(item.outputs, item.structure, expected.output,
                                    expected.structure, loose)
        del expected
        if not outcome.ok:
            raise Stop(Verdict(Status.WRONG_OUTPUT, f"{where}: wrong output: {outcome.reason}"))
    del items, answer
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    # The worker holds the outputs until told; the next round, on either side, needs the
    # memory (see reference_pool.unfit for the plan).
    channel.call(protocol.Release(), ctx.task.limits.case_s, stage)


def trusted_clock(ctx: Context, channel: Channel, bench: Benchmark, reference: ReferenceWorker,
                  index: int) -> None:
    """Time calls on kbench's own clock, where the worker cannot reach: passes of calls back
    to back on fresh input sets (kbench.worker.kept.clocked), each followed by a device-wide
    synchronisation, no hold, no flush, each pass one request whose round trip is timed here.
    Work hidden from the stopwatch, or a stopwatch forged in the worker, shows up as time per
    call the submission's median plus host dispatch do not explain: flagged. The passes'
    outputs are verified too.

    Two things come from the reference's process, which never loads a candidate (its case
    ``index``), while the submission is stopped. The baseline: the same pass with no call in
    it, drawing the same inputs, subtracted from the submission's round trip. Measured in the
    worker, a submission could make it as long as its real pass (6x for the same math); here
    it can gain at most the draws' own cost, by forging its input generator, which the
    verification of outputs and the copy-bandwidth bound confine (docs/security.md). A pass
    with no subtraction would charge an honest kernel the draws, as long as the call itself
    for a memory-bound one. And the control: the reference's own pass against its own
    median, at that moment. What the host's contention adds to an honest call (nvcc on every
    other core) shows up there too, so each pass is allowed the control's excess, scaled to
    the submission's time where that is longer (contention that stretches calls); a busy host
    cannot make an honest kernel look like it hides work, while a kernel that hides work
    fails every pass unless the control is slowed as much, which a stopped submission cannot
    do. No control, no clock: a case the reference could not be timed at has no speedup
    either (kbench.grading.rounds). Eager mode only: a graph replay's figures leave out the
    per-call dispatch that such a pass includes."""
    mine, theirs = bench.candidate, bench.reference
    if ctx.options.timing is not TimingMode.EAGER or theirs is None:
        return
    calls, control_calls = _calls(mine.ms), _calls(theirs.ms)
    explained, control_explained = _explained(ctx, mine), _explained(ctx, theirs)
    share, ms = _CLOCK_SLACK[ctx.device.type]
    best: tuple[float, float, float] | None = None  # over allowed, ms per call, control's excess
    for _ in range(_CLOCKED_PASSES):
        with channel.frozen():
            control = reference.run(index, lambda ref: _control(ctx, ref, bench.params, calls,
                                                                control_calls))
        if control is None:
            raise Stop(Verdict(Status.INTERNAL_ERROR, f"benchmark {params_text(bench.params)}: "
                               "kbench's own clock needs the reference's process, which failed "
                               f"({reference.failure})"))
        baseline_ms, control_ms = control
        took = _clocked_pass(ctx, channel, bench, calls, baseline_ms)
        excess = max(0.0, control_ms - control_explained)
        allowed = explained + share * mine.ms + ms + excess * max(1.0, explained
                                                                  / control_explained)
        if best is None or took - allowed < best[0]:
            best = (took - allowed, took, excess)
        if took <= allowed:
            break
    over, took, excess = best
    mine.trusted_ms = took
    if over > 0:
        raise Stop(Verdict(Status.FLAGGED, f"benchmark {params_text(bench.params)}: kbench's "
                           f"own clock took {took:.4g} ms per call at best in "
                           f"{_CLOCKED_PASSES} passes; the submission's timing explains "
                           f"{explained:.4g} ms ({mine.ms:.4g} ms timed + host dispatch), and "
                           f"the host's contention then added {excess:.3g} ms a call to the "
                           "reference's: work was hidden from the stopwatch or the stopwatch "
                           "was tampered with"))


def _calls(ms: float) -> int:
    return min(_CLOCKED_MAX_CALLS, max(1, math.ceil(_CLOCKED_MS / ms)))


def _explained(ctx: Context, timed: Measurement) -> float:
    """Per call, what the stopwatch accounts for: its median, plus the host's dispatch on
    CUDA (outside the device interval the median is)."""
    return timed.ms + (timed.host_ms or 0.0 if ctx.device.type == "cuda" else 0.0)


def _control(ctx: Context, ref: Channel, params: Params, calls: int, control_calls: int
             ) -> tuple[float, float]:
    """On the reference's process: the round trip of an empty pass of ``calls`` (the
    submission's baseline), and ms per call of a full pass of ``control_calls`` less its own
    empty pass."""
    empty = {}
    for count in dict.fromkeys((calls, control_calls)):  # the control's prepared last
        _prepare(ctx, ref, params, count)
        empty[count] = _round_trip(ctx, ref, params, protocol.Clocked(True), count)[0]
    full = _round_trip(ctx, ref, params, protocol.Clocked(False), control_calls)[0]
    ref.call(protocol.Release(), ctx.task.limits.case_s, "kbench's own clock")
    return empty[calls], max(0.0, full - empty[control_calls]) / control_calls


def _clocked_pass(ctx: Context, channel: Channel, bench: Benchmark, calls: int,
                  baseline_ms: float) -> float:
    """One pass of ``calls`` calls, its outputs verified: ms per call on kbench's clock."""
    _prepare(ctx, channel, bench.params, calls)
    took, kept = _round_trip(ctx, channel, bench.params, protocol.Clocked(False), calls)
    verify(ctx, channel, bench.params, kept)
    return max(0.0, took - baseline_ms) / calls


def _prepare(ctx: Context, channel: Channel, params: Params, calls: int) -> None:
    dtype = ctx.task.benchmark_dtype
    channel.call(protocol.Prepare(params=params, dtype=dtype, distribution=ctx.distribution,
                                  model=ctx.spec(params, dtype), calls=calls),
                 ctx.task.limits.benchmark_s, f"benchmark {params_text(params)}")


def _round_trip(ctx: Context, channel: Channel, params: Params, request: protocol.Clocked,
                calls: int) -> tuple[float, list[int]]:
    """ms from sending a prepared pass to its answer, here, and the calls it kept."""
    stage = f"benchmark {params_text(params)}"
    t0 = time.perf_counter()
    answer = channel.call(request, ctx.task.limits.benchmark_s, stage)
    took = (time.perf_counter() - t0) * 1e3
    if answer.calls != calls:
        raise Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker's clocked pass did "
                           f"not run the {calls} calls asked for"))
    return took, answer.kept


def ordered(bench: Benchmark) -> None:
    """Work a call left on other streams is charged to its figures (kbench.measurement);
    where it is a large part of the call, the output was handed back before the work writing
    it was ordered before the caller's stream, a race for any real caller: flagged."""
    side = bench.candidate.side_work_ms
    if side is not None and side > max(measurement.UNORDERED_MS,
                                       measurement.UNORDERED_SHARE * bench.candidate.ms):
        raise Stop(Verdict(Status.FLAGGED, f"benchmark {params_text(bench.params)}: the "
                           f"device stayed busy {side:.3g} ms after the call's stream was "
                           "done: work left on other streams, not ordered before the caller's "
                           "stream, so the output was returned before it was ready"))


def within_copy_bandwidth(bench: Benchmark, copy_gbps: float | None) -> None:
    gbps = bench.candidate.gbps
    if copy_gbps and gbps and gbps > _MAX_COPY_SHARE * copy_gbps:
        raise Stop(Verdict(Status.FLAGGED, f"benchmark {params_text(bench.params)}: "
                           f"{gbps:.0f} GB/s is {gbps / copy_gbps:.1f}x the copy bandwidth "
                           f"measured in this run ({copy_gbps:.0f} GB/s): the timed calls "
                           "cannot have moved the bytes the task needs"))
