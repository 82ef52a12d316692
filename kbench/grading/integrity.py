"""Checks that timed figures are honest: outputs of timed calls verified, kbench's own clock
against the submission's figures, work left on other streams, and achieved bandwidth against
the copy bandwidth measured in the same run. Each failure is a Stop, mostly flagged."""

from __future__ import annotations

import math
import random
import statistics
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

# The trusted clock (see trusted_clock): _CLOCKED_PASSES passes, and as many again where
# those are not explained, each of as many calls as the median says fill _CLOCKED_MS (within 1
# and _CLOCKED_MAX_CALLS, and no more than the reference's median says fill _CONTROL_MS: the
# control makes as many), so the round trip's noise is small beside them. What the median
# plus host dispatch explain, moved as the trusted control's passes moved from its own
# median, must account for the passes' median time per call within this share of it plus
# this many ms (wider on a CPU, where warm calls and cold ones differ more, and not alike
# for every kernel).
_CLOCKED_PASSES = 3
_CLOCKED_ROUNDS = 2
_CLOCKED_MS = 20.0
_CLOCKED_MAX_CALLS = 2000
_CONTROL_MS = 200.0
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

    Two things come from the reference's process (case ``index``), which never loads a
    candidate, while the submission is stopped:

    - the baseline, the same pass with no call in it (the same draws), subtracted from the
      round trip. Taken in the worker, a submission could pad it to its real pass's length
      (6x for the same math). Here it gains at most the draws' cost, and only by forging its
      input generator, which output verification and the copy-bandwidth bound confine
      (docs/security.md). No subtraction at all would charge an honest memory-bound kernel
      the draws, about as long as its call;
    - the control, the reference's own pass of the same calls, interleaved with the
      submission's, against the reference's median. The host's load moves a pass against a
      median (nvcc on every other core adds to each call; with more busy processes than
      cores the scheduler stretches the median's calls more than a pass's) for both alike,
      so the submission's figures are moved as the control's were, by the same factor or the
      same ms per call, whichever expects more. A busy host then neither makes an honest
      kernel look like it hides work nor hides a forged stopwatch in its noise (a check
      that only ever widened the allowance passed one forged to a third), and a stopped
      submission cannot slow the control.

    Median against median over the same passes: under such load a pass may lose several
    times its length to the scheduler or be spared, and best against best turned on which
    side had the one lucky pass. An honest kernel's excess also varies from one set of passes
    to the next (on an H200 at 32768x65535, one set of 48 went 7 % past the slack with two
    GPUs busy), so a second set is timed where the first fails. No control, no clock: a case
    the reference could not be timed at has no speedup either (kbench.grading.rounds). Eager
    mode only: a graph replay's figures leave out the per-call dispatch a pass includes."""
    mine, theirs = bench.candidate, bench.reference
    if ctx.options.timing is not TimingMode.EAGER or theirs is None:
        return
    calls = min(_CLOCKED_MAX_CALLS, max(1, math.ceil(_CLOCKED_MS / mine.ms)),
                max(1, math.ceil(_CONTROL_MS / theirs.ms)))
    explained, control_explained = _explained(ctx, mine), _explained(ctx, theirs)
    share, ms = _CLOCK_SLACK[ctx.device.type]
    took: list[float] = []  # ms per call: the submission's passes
    control: list[float] = []  # and the reference's, interleaved with them
    for _ in range(_CLOCKED_ROUNDS):
        for _ in range(_CLOCKED_PASSES):
            with channel.frozen():
                timed = reference.run(index, lambda ref: _control(ctx, ref, bench.params,
                                                                  calls))
            if timed is None:
                raise Stop(Verdict(Status.INTERNAL_ERROR, f"benchmark {params_text(bench.params)}"
                                   ": kbench's own clock needs the reference's process, which "
                                   f"failed ({reference.failure})"))
            took.append(_clocked_pass(ctx, channel, bench, calls, timed[0]))
            control.append(timed[1])
        typical = statistics.median(control)
        expected = max(explained * typical / control_explained,
                       explained + typical - control_explained)
        allowed = (1 + share) * expected + ms
        mine.trusted_ms = statistics.median(took)
        if mine.trusted_ms <= allowed:
            return
    raise Stop(Verdict(Status.FLAGGED, f"benchmark {params_text(bench.params)}: kbench's "
                       f"own clock took {mine.trusted_ms:.4g} ms per call (median of "
                       f"{len(took)} passes); the submission's timing explains "
                       f"{explained:.4g} ms ({mine.ms:.4g} ms timed + host dispatch), "
                       f"{expected:.4g} ms on this host then (the reference, timed "
                       f"alongside, took {typical:.4g} ms per call against its "
                       f"{control_explained:.4g} ms): work was hidden from the stopwatch "
                       "or the stopwatch was tampered with"))


def _explained(ctx: Context, timed: Measurement) -> float:
    """Per call, what the stopwatch accounts for: its median, plus the host's dispatch on
    CUDA (outside the device interval the median is)."""
    return timed.ms + (timed.host_ms or 0.0 if ctx.device.type == "cuda" else 0.0)


def _control(ctx: Context, ref: Channel, params: Params, calls: int) -> tuple[float, float]:
    """On the reference's process: the round trip of an empty pass of ``calls`` (the
    baseline of both sides), and ms per call of a full pass less it. The full pass is the
    submission's in every step (the same calls, input sets and draws), so that caches treat
    the two alike: a control of fewer calls kept its sets in a CPU's cache and ran 7x below
    its median where the submission's ran at its own."""
    _prepare(ctx, ref, params, calls)
    empty = _round_trip(ctx, ref, params, protocol.Clocked(True), calls)[0]
    full = _round_trip(ctx, ref, params, protocol.Clocked(False), calls)[0]
    ref.call(protocol.Release(), ctx.task.limits.case_s, "kbench's own clock")
    return empty, max(0.0, full - empty) / calls


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
