"""Checks that timed figures are honest: outputs of timed calls verified, kbench's own clock
against the submission's figures, work left on other streams, and achieved bandwidth against
the copy bandwidth measured in the same run. Each failure is a Stop, mostly flagged."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import torch

from kbench.grading.channel import Channel, Stop
from kbench.grading.checking.compare import compare_in_chunks
from kbench.grading.context import Context
from kbench.grading.options import TimingMode
from kbench.grading.timing import measurement
from kbench.problems.task import Params
from kbench.results.run_record import Benchmark, Measurement, params_text
from kbench.results.verdict import Status, Verdict
from kbench.shared import protocol
from kbench.shared.fingerprint import fingerprint, same_fingerprint

_random = random.SystemRandom()  # choices a submission must not be able to predict

# Outputs of timed calls verified per round: the two latest and others picked at random.
_VERIFIED = 8

# A submission whose achieved bandwidth (the task's minimum bytes over its median time) beats
# the copy bandwidth measured in the same run by more than this factor did not move those
# bytes: it skipped work while timed (replayed, cached or left out the computation).
_MAX_COPY_SHARE = 1.5

# The trusted clock: per case, kbench times passes of calls run back to back on its own clock
# (the best one counts, see _clocked_pass), each pass as many calls as the submission's median
# says fill _CLOCKED_MS (within 1 and _CLOCKED_MAX_CALLS), so the round trip's noise is small
# beside it. The submission's figure (see _stopwatch) plus its host dispatch time must explain
# the best pass's time per call, within this share of the figure plus this many ms (wider on a
# CPU, where a pass of warm calls and the cold timed ones differ more). Passes are timed until
# one is explained, _CLOCKED_ROUNDS sets of _CLOCKED_PASSES at most before a flag: an honest
# kernel's excess varies from pass to pass (on an H200 at 32768x65535, 4.4 ms a call, one set
# of 48 went 7 % past the slack with two GPUs busy), a kernel hiding work fails every pass, so
# stopping at the first explained pass decides as the best of all would. On a disturbed host
# (other processes on the cores, kbench's own builds beside it) up to _DISTURBED_ROUNDS sets
# are timed: a pass only gains time from load, so the more passes, the likelier one ran
# undisturbed, while a kernel hiding work fails every one of them too.
_CLOCKED_PASSES = 3
_CLOCKED_ROUNDS = 2
_DISTURBED_ROUNDS = 8
_CLOCKED_MS = 20.0
_CLOCKED_MAX_CALLS = 2000
# Each call of a pass draws a fresh input set too: for a KernelBench problem, its get_inputs
# under a new seed, some 0.2 ms of host time against a 10 us kernel. A pass is also held to
# about _PASS_MS of calls and draws (their cost per call timed first in kbench's own process,
# _PROBE_CALLS empty calls), and no fewer than _MIN_CALLS calls where the submission's median
# asks for more: on 4 H100s, 2000-call passes of launch-bound real samples took 6-15 s of a
# sample's timing (docs/evidence/h100x4-2026-11-27-timed-batch). A round trip's noise (well
# under 1 ms) over _MIN_CALLS calls stays far below the slack's 0.1 ms a call.
_PASS_MS = 25.0
_MIN_CALLS = 50
_PROBE_CALLS = 16
_CLOCK_SLACK = {"cuda": (0.15, 0.1), "cpu": (0.5, 1.0)}
# On a disturbed GPU host, a best pass under this share of the figure is no reading (_best_pass).
_READABLE_SHARE = 0.5

# A call whose median host time is this share of the longest hold waited on the device.
_WAITED_SHARE = 0.8


class TimingFlag(Stop):
    """A flag from a check that host load can fool (kbench's own clock, the ordering check):
    kbench.grading.timing.disturbance decides whether it stands. ``seen_ms``: the call's time per
    call as the check saw it, where that is what a disturbed timing's interval widens to;
    ``explained_ms``: what the submission's own figures explain of it. ``accuses``: False
    where the check could not read the call at all (never a flag: see trusted_clock)."""

    def __init__(self, verdict: Verdict, check: str, bench: Benchmark,
                 seen_ms: float | None = None, explained_ms: float | None = None,
                 load_explains: Callable[[], str | None] = lambda: None,
                 accuses: bool = True) -> None:
        super().__init__(verdict)
        self.check, self.bench, self.accuses = check, bench, accuses
        self.seen_ms, self.explained_ms = seen_ms, explained_ms
        # Asked only where the host stayed busy to the end: why that load explains the flag
        # (see _reference_inflation), or None where it does not.
        self.load_explains = load_explains


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
    ctx.release()
    # The worker holds the outputs until told; the next round, on either side, needs the
    # memory (see reference_pool.unfit for the plan).
    channel.call(protocol.Release(), ctx.task.limits.case_s, stage)


def clocked_calls(ms: float, draw_ms: float) -> int:
    """Calls in a clocked pass of a call the submission times at ``ms``, each with an input
    draw of ``draw_ms``: enough to fill _CLOCKED_MS, within _MIN_CALLS to _PASS_MS of calls
    and draws, and at most _CLOCKED_MAX_CALLS."""
    bounded = max(_MIN_CALLS, math.floor(_PASS_MS / (ms + draw_ms)))
    return max(1, min(_CLOCKED_MAX_CALLS, math.ceil(_CLOCKED_MS / ms), bounded))


def trusted_clock(ctx: Context, channel: Channel, bench: Benchmark,
                  disturbed: Callable[[], bool] = lambda: False,
                  kbench_empty: Callable[[int, int, float], list[float]] =
                  lambda calls, passes, wait_ms: [],
                  reference_pass: Callable[[int], float | None] = lambda calls: None
                  ) -> None:
    """Time calls on kbench's own clock, where the worker cannot reach: passes of calls back to
    back on fresh input sets (see kbench.worker.kept.clocked), each call followed by a
    device-wide synchronisation, no hold, no flush, as one request whose round trip is timed
    here, and the same request with no call in it (on a GPU, a wait on the device as long as
    the figure in each call's place, its device time taken out: kbench.worker.hold.DeviceWait).
    The shortest trip with the calls less the shortest without, per call, over the passes
    timed so far, must be explained by the submission's figure (_stopwatch) plus its host
    dispatch time; work hidden from the stopwatch, or a stopwatch tampered with in the worker,
    shows up as the difference: flagged. The trips without calls include
    ``kbench_empty(calls, passes, wait_ms)``'s, timed in a process of kbench's (the
    reference's): a worker slowing its own empty trips cannot shorten the difference; a short
    empty pass there first gives the input draws' cost (clocked_calls). Where kbench's empty
    trips decide, a set more confirms an explanation; on a disturbed host kbench's are taken
    with every pass, and an explanation needs two sets of passes (_best_pass).
    The fastest pass's outputs are verified too. Passes go on until one is explained (an honest
    kernel's first, mostly), two sets of _CLOCKED_PASSES at most; while ``disturbed()`` says
    the host is disturbed, more sets (_DISTURBED_ROUNDS in all). A flag carries how to ask
    whether load explains it (``reference_pass``: the reference's own ms per call on this
    clock, now; see _reference_inflation). Eager mode only: a graph replay's figures leave
    out the per-call dispatch that such a pass includes."""
    if ctx.options.timing is not TimingMode.EAGER:
        return
    mine = bench.candidate
    calls = clocked_calls(mine.ms, 0.0)
    if calls > _MIN_CALLS:  # the draws' cost may lower it: timed in kbench's process
        calls = clocked_calls(mine.ms, min(kbench_empty(_PROBE_CALLS, 1, 0.0), default=0.0)
                              * 1e3 / _PROBE_CALLS)
    cuda = ctx.device.type == "cuda"
    timed, what = _stopwatch(mine, cuda)
    explained = timed + (mine.host_ms or 0.0 if cuda else 0.0)
    share, ms = _CLOCK_SLACK[ctx.device.type]
    allowed = explained + share * timed + ms
    wait_ms = timed if cuda else 0.0
    best, passes, full_ms = _best_pass(ctx, channel, bench, (calls, wait_ms), allowed,
                                       disturbed,
                                       lambda calls, passes: kbench_empty(calls, passes, wait_ms))
    mine.trusted_ms = best
    if best is None:  # the clock could not read the calls under this load (see _best_pass)
        raise TimingFlag(Verdict(Status.OK, f"benchmark {params_text(bench.params)}: kbench's "
                                 f"own clock read under {_READABLE_SHARE:.0%} of the "
                                 f"{timed:.4g} ms a call the stopwatch says in {passes} passes "
                                 "on a disturbed host: it cannot tell the calls' time there"),
                         "clock", bench, full_ms, accuses=False)
    if best > allowed:
        raise TimingFlag(Verdict(Status.FLAGGED, f"benchmark {params_text(bench.params)}: kbench's "
                           f"own clock took {best:.4g} ms per call at best in "
                           f"{passes} passes; the submission's "
                           f"timing explains {explained:.4g} ms ({timed:.4g} ms {what}): "
                           "work was hidden from the stopwatch or the "
                           "stopwatch was tampered with"), "clock", bench,
                         best - (mine.host_ms or 0.0 if cuda else 0.0), explained,
                         (lambda: None) if cuda else lambda: _reference_inflation(
                             bench, best, explained, timed, reference_pass(calls)))


def _best_pass(ctx: Context, channel: Channel, bench: Benchmark, plan: tuple[int, float],
               allowed: float, disturbed: Callable[[], bool],
               kbench_empty: Callable[[int, int], list[float]]
               ) -> tuple[float | None, int, float]:
    """The clock's best ms per call, the passes it took and the fastest trip with the calls
    per call (see trusted_clock), for ``plan``: calls per pass, and the empty passes' device
    wait per call (the figure, on a GPU). The best is the shortest round trip with the calls
    less the shortest without, kbench's own empty trips and the worker's. Load only lengthens
    a trip, so the difference falls below the calls' time only where the empty trips' least
    is slowed more than the full ones': where few empty trips decide. So where kbench's
    decide and the explanation hangs on them (the calls' trip alone would not be explained),
    another set of kbench's is taken after the worker's fastest trip before it is believed: a
    worker padding its own empty trips leaves kbench's few to decide (on an H200 beside 32
    busy processes, a stopwatch forged to a third with its empty passes padded passed so,
    1.92x at 8192x8192; on a quiet 2-core CPU, once in four runs). On a disturbed host
    kbench's empty trip is taken with every pass and no explanation is believed before two
    sets of passes, nor one under _READABLE_SHARE of the figure: with every core busy twice
    over, the host thread's lateness after each call can outlast the call's device time,
    and a stopwatch forged to a third read 0 ms a call on an H200 in 24 passes. Where the
    passes end on such a reading the best is None: unreadable."""
    calls, wait_ms = plan
    kbench_s = min(kbench_empty(calls, _CLOCKED_PASSES), default=math.inf)
    worker_s = full = math.inf
    passes, confirmed = 0, False  # confirmed: kbench's taken since the fastest trip

    def per_call() -> float:
        return max(0.0, full - min(kbench_s, worker_s)) * 1e3 / calls

    while True:
        trips = _clocked_pass(ctx, channel, bench, plan, full)
        confirmed = confirmed and trips[1] >= full
        worker_s, full = min(worker_s, trips[0]), min(full, trips[1])
        passes += 1
        steady = not disturbed()
        if not steady:
            kbench_s = min([kbench_s, *kbench_empty(calls, 1)])
        best = per_call()
        if best <= allowed < full * 1e3 / calls and kbench_s < worker_s and not confirmed:
            kbench_s = min([kbench_s, *kbench_empty(calls, _CLOCKED_PASSES)])
            best, confirmed = per_call(), True
        readable = steady or best >= _READABLE_SHARE * wait_ms
        explained = best <= allowed and (steady or (
            readable and passes >= _CLOCKED_ROUNDS * _CLOCKED_PASSES))
        if explained or passes >= _DISTURBED_ROUNDS * _CLOCKED_PASSES:
            return best if readable else None, passes, full * 1e3 / calls
        if passes >= _CLOCKED_ROUNDS * _CLOCKED_PASSES and passes % _CLOCKED_PASSES == 0 \
                and steady:
            return best, passes, full * 1e3 / calls


def _reference_inflation(bench: Benchmark, best: float, explained: float, timed: float,
                         reference_ms: float | None) -> str | None:
    """Does the host's load explain a clock flag? Load stretches kbench's clock passes over
    the stopwatch's figures for any code, the reference's too: on a 2-core machine beside
    two busy loops, honest torch baselines' passes ran 2.5x their fastest timed calls to the
    end of the run. So the reference's own passes, timed now on the same clock in kbench's
    process while the submission's are stopped, over the reference's own figure (the same
    _stopwatch) give the load's stretch; the submission's allowance is stretched by as much.
    A stopwatch forged to a third is still flagged while the stretch stays under 2; past
    that it is explained too (docs/timing.md: an open gap). On a CPU only: there the
    stopped submission cannot run while the reference's passes are timed, where on a GPU
    work it queued before it was stopped still can, stretching the reference's passes.
    None where it does not explain the flag, or the reference could not be timed."""
    ref = bench.reference
    if ref is None or reference_ms is None:
        return None
    ref_explained, _ = _stopwatch(ref, cuda=False)
    if ref_explained <= 0:
        return None
    stretch = max(1.0, reference_ms / ref_explained)
    share, ms = _CLOCK_SLACK["cpu"]
    allowed = (explained + share * timed) * stretch + ms
    if best > allowed:
        return None
    return (f"the reference's own calls took {stretch:.3g}x its figure on kbench's clock in "
            f"the same load ({reference_ms:.4g} ms against {ref_explained:.4g} ms), which "
            f"explains the submission's {best:.4g} ms (allowed {allowed:.4g} ms)")


def _stopwatch(mine: Measurement, cuda: bool) -> tuple[float, str]:
    """The submission's figure the clock's best pass is held to, and what it is. On CUDA its
    median: device time under a hold, which host load does not stretch (the slack was
    measured against it on H100s and H200s). On a CPU its fastest call: there the stopwatch
    is host time, which load stretches as it stretches the clock's passes, and the clock
    takes its best pass, so a median stretched by load explained a clock's pass of the real
    work: under busy loops on every core of a CI machine a stopwatch forged to a third
    passed against its median."""
    if cuda or mine.fastest_ms is None:
        return mine.ms, "timed + host dispatch" if cuda else "timed"
    return mine.fastest_ms, "its fastest timed call"


def _clocked_pass(ctx: Context, channel: Channel, bench: Benchmark, plan: tuple[int, float],
                  fastest_s: float) -> tuple[float, float]:
    """One pass of ``plan``'s calls: the seconds of the request's round trip with no call in
    it (its device waits, ``plan``'s ms each, taken out) and with the calls, on kbench's
    clock; the pass's outputs verified where its calls' trip is the fastest yet (under
    ``fastest_s``). The best pass is the shortest round trip
    with the calls less the shortest without: load only lengthens a round trip, so neither
    minimum is below what it measures, where a difference taken pass by pass (an empty trip
    slowed, the full one not) can fall below the calls' time, and the least of many such
    differences, on a busy host, did: a stopwatch forged to a third passed. Only the fastest
    trip with the calls counts, so the outputs of that pass are the ones that must be right
    (a pass made fast by skipping work is caught there); verifying every pass's took 72 of
    the 117 s of a forged stopwatch's 48 passes on a busy 2-core machine."""
    stage = f"benchmark {params_text(bench.params)}"
    limit = ctx.task.limits.benchmark_s
    dtype = ctx.task.benchmark_dtype
    calls, wait_ms = plan
    channel.call(protocol.Prepare(params=bench.params, dtype=dtype,
                                  distribution=ctx.distribution,
                                  model=ctx.spec(bench.params, dtype), calls=calls),
                 limit, stage)
    seconds = []
    for empty in (True, False):
        t0 = time.perf_counter()
        answer = channel.call(protocol.Clocked(empty, wait_ms if empty else 0.0), limit, stage)
        seconds.append(measurement.less_waits(time.perf_counter() - t0, answer))
        if answer.calls != calls:
            raise Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker's clocked pass "
                               f"did not run the {calls} calls asked for"))
    if seconds[1] < fastest_s:
        verify(ctx, channel, bench.params, answer.kept)
    else:
        channel.call(protocol.Release(), ctx.task.limits.case_s, stage)
    return seconds[0], seconds[1]


def ordered(bench: Benchmark) -> None:
    """Work a call left on other streams is charged to its figures
    (kbench.grading.timing.measurement); where it is a large part of the call, the output was handed
    back before the work writing it was ordered before the caller's stream, a race for any real
    caller: flagged. Not a call that waited on the device while it was queued (it synchronised:
    its queueing outlasted kbench's longest hold): on an H100 one such call, its work done when
    it returned, read 0.09-0.15 ms of the device busy after it by this measure. Its side work is
    still charged, and an output still being written when it returned fails verification
    (the fingerprint taken as the call returned), so it gains nothing either way."""
    mine = bench.candidate
    side = mine.side_work_ms
    waited = (mine.host_ms or 0.0) >= _WAITED_SHARE * protocol.HOLD_MAX_MS
    if side is not None and not waited and side > max(
            measurement.UNORDERED_MS, measurement.UNORDERED_SHARE * mine.ms):
        raise TimingFlag(Verdict(
            Status.FLAGGED, f"benchmark {params_text(bench.params)}: the device stayed busy "
            f"{side:.3g} ms after the call's stream was done: work left on other streams, "
            "not ordered before the caller's stream, so the output was returned before it "
            "was ready"), "ordering", bench)


def within_copy_bandwidth(ctx: Context, bench: Benchmark, copy_gbps: float | None,
                          notes: list[str]) -> None:
    """The fewest bytes a call must move (kbench.problems.task.Task.min_bytes) over its
    median time, against the copy bandwidth measured in the run: far above it, the calls
    skipped work. Only where that bound holds: on a GPU whose L2 cannot hold those bytes
    (the cache is flushed before every timed call, and a copy far past it is the yardstick).
    On a CPU, whose last-level cache may hold them between calls however much kbench writes
    to flush it, and wherever they fit the L2, the finding goes to ``notes`` instead: an
    honest lookup over a table a cache held ran at 1.6x a 256 MiB copy on a CPU."""
    gbps = bench.candidate.gbps
    if not (copy_gbps and gbps and gbps > _MAX_COPY_SHARE * copy_gbps):
        return
    size = params_text(bench.params)
    if ctx.device.type != "cuda" or (bench.nbytes or 0) <= _l2_bytes(ctx):
        notes.append(f"{gbps / copy_gbps:.1f}x the copy bandwidth at {size}, not judged: its "
                     "bytes may stay in a cache")
        return
    raise Stop(Verdict(Status.FLAGGED, f"benchmark {size}: {gbps:.0f} GB/s is "
                       f"{gbps / copy_gbps:.1f}x the copy bandwidth measured in this run "
                       f"({copy_gbps:.0f} GB/s): the timed calls cannot have moved the "
                       "bytes the task needs"))


def _l2_bytes(ctx: Context) -> int:
    return torch.cuda.get_device_properties(ctx.device).L2_cache_size
