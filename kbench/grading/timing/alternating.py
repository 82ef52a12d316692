"""Timing a submission: each benchmark case in rounds that alternate with the reference's, so
slow drift of the machine weighs on both sides of a speedup alike; launch-bound cases take
every round in a fresh process on both sides. Each round's outputs are verified and each case
passes the integrity checks before its speedups are computed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from kbench.grading.channel import Channel
from kbench.grading.checking import kernelbench_rules as kb_rules
from kbench.grading.context import Context
from kbench.grading.options import TimingMode
from kbench.grading.timing import integrity, kernelbench_timing, measurement
from kbench.grading.timing.disturbance import Judge
from kbench.grading.timing.reference_pool import ReferencePool, ReferenceWorker
from kbench.results.run_record import Benchmark, SubmissionResult
from kbench.shared.protocol import Samples

OpenRound = Callable[[int], Channel]  # round r -> a new process of the submission, loaded


def time_submission(ctx: Context, channel: Channel, result: SubmissionResult,
                    reference: list[Benchmark], pool: ReferencePool,
                    open_round: OpenRound, judge: Judge) -> None:
    """Each case in rounds, alternating with the reference's. Cases whose reference ran
    under the task's ``fresh_rounds_below_ms`` at the start take the profile's fresh rounds
    (kbench.grading.options.Rigour), every
    round in a process of its own on each side: each process's launch path settles on its
    own level (some 0.2 us a kernel apart on an H200, docs/timing.md), which dominates a
    speedup of 10 us calls unless the rounds sample many processes. Those cases go first,
    round by round, so that a round costs one new process per side; the first is the
    submission's own process, where kbench's clock runs later. Eager mode only: graph
    replays launch no kernel one by one. The checks that host load can fool go through
    ``judge`` (kbench.grading.timing.disturbance); the seconds of each part go to ``timing_s``."""
    eager = ctx.options.timing is TimingMode.EAGER
    below = ctx.task.timing[ctx.device.type].fresh_rounds_below_ms if eager else 0.0
    mine: dict[int, list[Samples]] = {}  # per timed case, the submission's rounds
    theirs: dict[int, list[Samples | None]] = {}  # and the reference's
    for i, ref in enumerate(reference):
        result.benchmarks.append(Benchmark(params=ref.params, dtype=ref.dtype,
                                           skipped=ref.skipped, flops=ref.flops,
                                           nbytes=ref.nbytes))
        if ref.reference is not None:
            mine[i], theirs[i] = [], []
    fresh = [i for i in mine if reference[i].reference.ms < below]
    rigour = ctx.options.rigour
    part = _Parts(result.timing_s)

    def one_round(i: int, process: Channel, worker: ReferenceWorker, count: int) -> None:
        params = reference[i].params
        with part("reference"), process.frozen(), channel.frozen() \
                if process is not channel else contextlib.nullcontext():
            theirs[i].append(worker.samples(i, params, count))  # no submission process runs
        with part("rounds"):
            mine[i].append(process.samples(params, count, keep=True))
        with part("verify"):
            integrity.verify(ctx, process, params, mine[i][-1].kept)

    for r in range(rigour.fresh_rounds if fresh else 0):
        with contextlib.ExitStack() as stack:
            with part("fresh processes"):
                here = channel if r == 0 else stack.enter_context(open_round(r))
            for i in fresh:
                one_round(i, here, pool.rounds[r], rigour.fresh_rounds)
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
        integrity.within_copy_bandwidth(bench, pool.copy_gbps)
        judge.checked(lambda b=bench: integrity.ordered(b))
        with part("clock"):
            judge.checked(lambda b=bench, i=i: integrity.trusted_clock(
                ctx, channel, b, judge.disturbed, lambda calls: _empty_trips(pool, channel, i,
                                                                            calls)))
    measurement.add_speedups(result, reference)
    kernelbench_timing.overall(result)


def _empty_trips(pool: ReferencePool, channel: Channel, index: int, calls: int) -> list[float]:
    """Empty clocked passes timed in the reference's clock process while the submission's
    processes are stopped: nothing of the submission can slow them."""
    with channel.frozen():
        return pool.clock.empty_trips(index, calls, integrity.CLOCKED_PASSES)


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
