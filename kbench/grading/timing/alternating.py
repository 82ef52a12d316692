"""Timing a submission: each benchmark case in rounds that alternate with the reference's, so
slow drift of the machine weighs on both sides of a speedup alike; launch-bound cases take
every round in a fresh process on both sides. Each round's outputs are verified and each case
passes the integrity checks before its speedups are computed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from kbench.grading.channel import Ahead, Channel, Stop
from kbench.grading.checking import kernelbench_rules as kb_rules
from kbench.grading.context import Context
from kbench.grading.options import TimingMode
from kbench.grading.timing import integrity, kernelbench_timing, measurement
from kbench.grading.timing.disturbance import Judge
from kbench.grading.timing.reference_pool import ReferencePool, ReferenceWorker
from kbench.problems.task import Params
from kbench.results.run_record import Benchmark, SubmissionResult
from kbench.results.verdict import Status, Verdict
from kbench.shared import protocol
from kbench.shared.protocol import Samples

# (rounds, warm-ups) -> the submission's processes for rounds 1 to rounds - 1, each loaded
# and warmed up on those cases (Channel.warm)
Warms = list[tuple[Params, protocol.Warm]]
OpenRounds = Callable[[int, Warms], list[Channel]]
_REFERENCE_PASSES = 3  # a set, as the submission's clock takes them


def fresh_cases(ctx: Context, reference: list[Benchmark]) -> list[int]:
    """The timed cases whose reference ran under the task's ``fresh_rounds_below_ms`` at the
    start: launch-bound, they take every round in a fresh process (eager mode only: graph
    replays launch no kernel one by one)."""
    if ctx.options.timing is not TimingMode.EAGER:
        return []
    below = ctx.task.timing[ctx.device.type].fresh_rounds_below_ms
    return [i for i, ref in enumerate(reference)
            if ref.reference is not None and ref.reference.ms < below]


def time_submission(ctx: Context, channel: Channel, result: SubmissionResult,
                    reference: list[Benchmark], pool: ReferencePool,
                    open_rounds: OpenRounds, judge: Judge) -> None:
    """Each case in rounds, alternating with the reference's. Cases whose reference ran
    under the task's ``fresh_rounds_below_ms`` at the start take the profile's fresh rounds
    (kbench.grading.options.Rigour), every
    round in a process of its own on each side: each process's launch path settles on its
    own level (some 0.2 us a kernel apart on an H200, docs/timing.md), which dominates a
    speedup of 10 us calls unless the rounds sample many processes. Those cases go first,
    round by round, so that a round costs one new process per side; the first is the
    submission's own process, where kbench's clock runs later. The other rounds' processes
    (``open_rounds``) were loaded and warmed up on those cases while the submission was
    checked (kbench.grading.running.submission), as the reference's are as they open, so
    that no round waits for a load or a first warm-up; they stay open, and stopped whenever
    the reference runs, until the last of those rounds. Every process of the submission is
    stopped while the reference runs (kbench's own work readied beside it is stopped by the
    caller for the whole timing). The checks that host load can fool go through ``judge``
    (kbench.grading.timing.disturbance); the seconds of each part go to ``timing_s``."""
    mine: dict[int, list[Samples]] = {}  # per timed case, the submission's rounds
    theirs: dict[int, list[Samples | None]] = {}  # and the reference's
    for i, ref in enumerate(reference):
        result.benchmarks.append(Benchmark(params=ref.params, dtype=ref.dtype,
                                           skipped=ref.skipped, flops=ref.flops,
                                           nbytes=ref.nbytes))
        if ref.reference is not None:
            mine[i], theirs[i] = [], []
    fresh = fresh_cases(ctx, reference)
    rigour = ctx.options.rigour
    part = _Parts(result.timing_s)
    processes = [channel]  # the submission's processes for its rounds, open now

    def one_round(i: int, process: Channel, worker: ReferenceWorker, count: int) -> None:
        params = reference[i].params
        with part("reference"), all_frozen(processes):  # none of it runs
            theirs[i].append(worker.samples(i, params, count))
        with part("rounds"):
            mine[i].append(process.samples(params, count, keep=True))
        with part("verify"):
            integrity.verify(ctx, process, params, mine[i][-1].kept)

    # each fresh-round process's first warm-up of those cases, done as it opens, side by side
    warms = [(reference[i].params, ctx.warm_request(reference[i].params)) for i in fresh]
    with part("reference processes"), all_frozen(processes):  # opened, if not yet
        pool.ready(warms, eager=ctx.options.timing is TimingMode.EAGER)
    if fresh:
        with part("fresh processes"):
            processes += open_rounds(rigour.fresh_rounds, warms)
        try:
            for r, here in enumerate(processes[:]):
                for i in fresh:
                    one_round(i, here, pool.rounds[r], rigour.fresh_rounds)
        finally:
            with part("fresh processes"):
                close_all(processes[1:])
            del processes[1:]
    for i in mine:
        if i not in fresh:
            for _ in range(rigour.rounds):
                one_round(i, channel, pool.main, rigour.rounds)
        bench, nbytes = result.benchmarks[i], ctx.traffic(reference[i].params)
        bench.candidate = measurement.summarise(mine[i], nbytes)
        ref_rounds = [t for t in theirs[i] if t is not None]
        if ref_rounds:
            bench.reference = measurement.summarise(ref_rounds, nbytes)
        else:
            bench.skipped = ("no speedup: the reference could not be timed alongside ("
                             + ("; ".join(sorted(pool.failures())) or "no reason given") + ")")
        if kb_rules.applies(ctx) and bench.reference is not None:
            with part("kernelbench"):
                kernelbench_timing.time_case(ctx, channel, pool.main, i, bench)
        integrity.within_copy_bandwidth(ctx, bench, pool.copy_gbps, result.flags)
        judge.checked(lambda b=bench: integrity.ordered(b))
        with part("clock"):
            judge.checked(lambda b=bench, i=i: integrity.trusted_clock(
                ctx, channel, b, judge.disturbed,
                lambda calls, passes, wait_ms: _empty_trips(pool, [channel], i, calls, passes,
                                                            wait_ms),
                lambda calls: _reference_pass(pool, [channel], i, calls)))
    _speedups(ctx, result, reference, judge)


def close_all(processes: list[Channel] | list[Ahead]) -> None:
    """Side by side: each waits for its CUDA context's end (0.14 s on an H200); closing one
    that is closed already does nothing."""
    if processes:
        with ThreadPoolExecutor(len(processes)) as closing:
            list(closing.map(lambda process: process.close(), processes))


def _speedups(ctx: Context, result: SubmissionResult, reference: list[Benchmark],
              judge: Judge) -> None:
    """kbench's and KernelBench's speedups; on a CPU whose other processes kept the host
    busy, intervals widened for it (a CPU's stopwatch is host time, which load stretches on
    each side unevenly: kbench.grading.timing.measurement)."""
    loaded = ctx.device.type == "cpu" and judge.loaded()
    measurement.add_speedups(result, reference, loaded)
    if loaded:
        judge.notes.append("its speedup's interval is widened for the host's load: each side's "
                           "fastest call over the other's median (docs/timing.md)")
    kernelbench_timing.overall(result)


def _empty_trips(pool: ReferencePool, processes: list[Channel], index: int, calls: int,
                 passes: int, wait_ms: float = 0.0) -> list[float]:
    """Empty clocked passes timed in the reference's clock process while the submission's
    processes are stopped: nothing of the submission can slow them. Where that process
    fails, once more in a new one; then kbench's own failure: the clock would otherwise
    subtract the submission's own empty passes, which it can pad."""
    for _ in range(2):
        with all_frozen(processes):
            trips = pool.clock.clocked_trips(index, calls, passes, wait_ms=wait_ms)
        if trips or pool.clock.skips[index] is not None:  # skipped: no speedup to trust
            return trips
    raise Stop(Verdict(Status.INTERNAL_ERROR, "kbench's clock: its empty passes could not be "
                       f"timed in the reference's process ({pool.clock.failure or 'no reason'})"))


def _reference_pass(pool: ReferencePool, processes: list[Channel], index: int,
                    calls: int) -> float | None:
    """The reference's own ms per call on kbench's clock now, in passes of ``calls`` calls
    in its clock process (the best with calls less the best without, as the submission's
    passes are taken) while the submission's processes are stopped; None where it cannot
    be had."""
    with all_frozen(processes):
        full = pool.clock.clocked_trips(index, calls, _REFERENCE_PASSES, empty=False)
        empty = pool.clock.clocked_trips(index, calls, _REFERENCE_PASSES)
    if not full or not empty:
        return None
    return max(0.0, min(full) - min(empty)) * 1e3 / calls


@contextlib.contextmanager
def all_frozen(processes: Iterable[Channel]) -> Iterator[None]:
    """Each of ``processes`` stopped meanwhile (kbench.sandbox.Sandbox.frozen)."""
    with contextlib.ExitStack() as stack:
        for process in processes:
            stack.enter_context(process.frozen())
        yield


class _Parts:
    """Wall seconds of the parts of a submission's timing, summed into ``into``."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.into[name] = round(self.into.get(name, 0.0) + time.monotonic() - start, 3)
