"""The reference's processes for a whole run: timed at the start, alongside each candidate and
at the end; torch.compile of it as a second baseline; and the run's reference table with notes
on what failed or drifted. No reference process ever loads a candidate."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import torch

from kbench.grading.channel import Channel, Stop
from kbench.grading.checking import correctness
from kbench.grading.context import Context
from kbench.grading.timing import measurement
from kbench.host import spawn
from kbench.problems.task import Params
from kbench.results.run_record import Benchmark, params_text
from kbench.results.verdict import Status, Verdict
from kbench.sandbox import child_env
from kbench.shared import protocol
from kbench.shared.protocol import Samples

# Copy-bandwidth buffers (each of source and destination): far past any cache.
_COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}
# The copy is a yardstick (a submission is accused only beyond 1.5x of it, and the reports
# show shares of it): a few hundred ms of samples place it well inside that. Held to the
# task's budget per shape instead (2 s on a CPU), it was a third of a small CPU grade's
# reference timing, once per run.
_COPY_BUDGET_MS = 300.0


class ReferenceWorker:
    """An eager reference's process. The main one, on opening, passes the reference's own
    correctness cases (proof that the tolerances accept its arithmetic, and the same process
    history as a candidate's grading process) and measures the copy bandwidth; the others
    (fresh rounds, the clock's) go straight to timing, as the candidate's fresh-round
    processes do. If it dies it is opened again, up to _REOPEN times."""

    _REOPEN = 2

    def __init__(self, ctx: Context, name: str, skips: list[str | None],
                 checks: bool = False) -> None:
        self.ctx = ctx
        self.name = name  # of its log
        self.checks = checks  # the main one: correctness cases and the copy bandwidth
        self.skips = skips  # per benchmark case: why it cannot run here (shared with the pool)
        self.channel: Channel | None = None
        self.copy_gbps: float | None = None
        self.failure: str | None = None
        self.opened = 0
        self._kept_trials: dict[int, list[float]] = {}  # per benchmark case (see trials)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def prestart(self) -> None:
        """Its process started now, unless it is open (kbench.host.spawn.prestart): the start
        overlaps other work, and opening it later finds it ready."""
        if self.channel is None:
            spawn.prestart(self.ctx.logs / f"{self.name}.run.log", child_env({}),
                           self.ctx.device.type, self.ctx.spare.cpus if self.ctx.spare else ())

    def ready(self, spec: protocol.ModelSpec, warms: list[tuple[Params, protocol.Warm]]
              ) -> None:
        """Open now where it can be, building the instance ``spec`` names (see Channel.load:
        nothing shared is touched, so workers open side by side), and warmed up on the cases
        of ``warms`` (Channel.warm); a failure is kept, and the round that needs it tries
        again."""
        if self.channel is None and self.opened <= self._REOPEN:
            try:
                channel = self._open(spec)
                for params, request in warms:
                    channel.warm(params, request)
            except Stop as stop:
                self.failure = stop.verdict.reason
                self.close()

    def samples(self, index: int, params: Params, rounds: int = 1) -> Samples | None:
        """One round at benchmark ``index``; None if the reference cannot be timed."""
        if self.skips[index] is not None:
            return None
        try:
            return self._open().samples(params, rounds)
        except Stop as stop:
            self.failure = stop.verdict.reason
            self.close()
            return None

    def trials(self, index: int, request: protocol.TimeTrials) -> list[float] | None:
        """KernelBench's timing of benchmark ``index`` (kbench.grading.timing.kernelbench_timing);
        None if the reference cannot be timed. Taken once and kept for the problem's later
        submissions on this device: the request is the same for each of them (KernelBench's
        fast_p analysis, too, divides by reference times measured once per problem, its
        baseline file). Taken again, it was half of the KernelBench-style trials' 2.0 s of a
        level-1 sample's 5.1 timing seconds
        (docs/evidence/h200x2-2026-11-27-timed-vs-kernelbench)."""
        if self.skips[index] is not None:
            return None
        if index in self._kept_trials:
            return self._kept_trials[index]
        try:
            self._kept_trials[index] = self._open().call(
                request, self.ctx.task.limits.benchmark_s,
                "the reference, timed as KernelBench times").ms
            return self._kept_trials[index]
        except Stop as stop:
            self.failure = stop.verdict.reason
            self.close()
            return None

    def clocked_trips(self, index: int, calls: int, passes: int, empty: bool = True,
                      wait_ms: float = 0.0) -> list[float]:
        """Seconds of ``passes`` round trips of a clocked pass of ``calls`` calls at benchmark
        ``index`` (kbench.worker.serve's ``clocked``), answered by this process, where no
        candidate runs; none where they cannot be had. ``empty``: input sets drawn, no call
        (on a GPU a wait of ``wait_ms`` on the device in its place, whose device time is
        taken out of the trip); else the reference's own calls in each pass."""
        if self.skips[index] is not None:
            return []
        ctx, params = self.ctx, self.ctx.benchmarks[index]
        stage = f"kbench's clock, {'empty' if empty else 'reference'} passes"
        dtype, limit = ctx.task.benchmark_dtype, ctx.task.limits.benchmark_s
        trips = []
        try:
            channel = self._open()
            for k in range(passes):  # a pass with the calls uses up its prepared input sets
                if k == 0 or not empty:
                    channel.call(protocol.Prepare(
                        params=params, dtype=dtype, distribution=ctx.distribution,
                        model=ctx.spec(params, dtype), calls=calls), limit, stage)
                t0 = time.perf_counter()
                answer = channel.call(protocol.Clocked(empty, wait_ms), limit, stage)
                trips.append(measurement.less_waits(time.perf_counter() - t0, answer))
            channel.call(protocol.Release(), limit, stage)
        except Stop as stop:
            self.failure = stop.verdict.reason
            self.close()
        return trips

    def _open(self, spec: protocol.ModelSpec | None = None) -> Channel:
        if self.channel is not None:
            return self.channel
        if self.opened > self._REOPEN:
            raise Stop(Verdict(Status.INTERNAL_ERROR, self.failure or "no reference"))
        self.opened += 1
        ctx = self.ctx
        channel = Channel(ctx, f"{self.name}.run.log", child_env({}))
        try:
            channel.load(ctx.reference_file, True, "Model", spec=spec)
            if self.checks:
                correctness.check(ctx, channel, ctx.reference_file, None)
                if self.copy_gbps is None:
                    self.copy_gbps = _copy_gbps(ctx, channel)
        except BaseException:
            channel.close()
            raise
        self.channel = channel
        return channel


def _copy_gbps(ctx: Context, channel: Channel) -> float | None:
    """Device-to-device copy bandwidth (bytes read plus written), by the same stopwatch."""
    nbytes, timing = _COPY_BYTES[ctx.device.type], ctx.timing(1)
    timing = dataclasses.replace(timing, budget_ms=min(timing.budget_ms, _COPY_BUDGET_MS))
    answer = channel.call(protocol.Copy(nbytes, timing), ctx.task.limits.benchmark_s,
                          "copy bandwidth")
    return measurement.summarise([answer.samples], 2 * nbytes).gbps


class ReferencePool:
    """"reference" (start, end, and alongside each candidate) and, for launch-bound cases,
    one process per fresh round: round r of a candidate divides the reference's round r in
    worker r."""

    def __init__(self, ctx: Context, copy_gbps: float | None = None) -> None:
        """``copy_gbps``: the copy bandwidth if this run measured it already."""
        self.ctx = ctx
        self.skips: list[str | None] = [None] * len(ctx.benchmarks)
        log = reference_log(ctx)
        self.main = ReferenceWorker(ctx, log, self.skips, checks=True)
        self.main.copy_gbps = copy_gbps
        self.rounds = [self.main] + [ReferenceWorker(ctx, f"{log}.round{r + 1}", self.skips)
                                     for r in range(1, ctx.options.rigour.fresh_rounds)]
        # kbench's clock subtracts empty round trips timed here: the candidate's worker could
        # slow its own. A process of its own, so that input sets it holds or fails to make
        # never touch the reference's timing.
        self.clock = ReferenceWorker(ctx, f"{log}.clock", self.skips)

    def __enter__(self) -> ReferencePool:
        return self

    def __exit__(self, *exc: object) -> None:
        """Every process closed, side by side (each waits for its worker's exit)."""
        with ThreadPoolExecutor(len(self.rounds) + 1) as closing:
            list(closing.map(lambda worker: worker.close(), (*self.rounds, self.clock)))

    @property
    def copy_gbps(self) -> float | None:
        return self.main.copy_gbps

    def prestart(self, fresh: bool, eager: bool) -> None:
        """The processes submissions' timing will open, started now (after the reference's
        start-of-run timing, which they would disturb): each fresh round's where a case is
        launch-bound (``fresh``), and the clock's in eager mode (kbench's clock)."""
        for worker in self._later(fresh, eager):
            worker.prestart()

    def ready(self, warms: list[tuple[Params, protocol.Warm]], eager: bool) -> None:
        """Those processes open, side by side, before a submission's timing begins (none
        starts while one is timed): each fresh round's where ``warms`` names launch-bound
        cases, warmed up on them, and the clock's in eager mode."""
        closed = [w for w in self._later(bool(warms), eager) if w.channel is None]
        if closed:
            spec = self.ctx.load_spec()  # here: it binds the problem's sizes (Channel.load)
            with ThreadPoolExecutor(len(closed)) as opening:
                list(opening.map(lambda worker: worker.ready(
                    spec, warms if worker is not self.clock else []), closed))

    def _later(self, fresh: bool, eager: bool) -> list[ReferenceWorker]:
        return [*(self.rounds[1:] if fresh else []), *([self.clock] if eager else [])]

    def plan(self) -> None:
        """Which benchmark cases fit in memory here (see unfit)."""
        self.skips[:] = unfit_cases(self.ctx)

    def time_all(self, only: list[Samples | None] | None = None) -> list[Samples | None]:
        """One round of every case (with ``only``: of the cases timed then)."""
        return [self.main.samples(i, params) if only is None or only[i] else None
                for i, params in enumerate(self.ctx.benchmarks)]

    def failures(self) -> set[str]:
        return {w.failure for w in self.rounds if w.failure}

    def table(self, start: list[Samples | None], end: list[Samples | None] | None,
              compiled: tuple[list[Samples | None], str | None] | None
              ) -> tuple[list[Benchmark], list[str]]:
        """The run's reference per case (start and end, each alone and pooled), and notes on
        what failed or drifted."""
        ctx = self.ctx
        table, notes, drifted = [], [], []
        for i, params in enumerate(ctx.benchmarks):
            nbytes = ctx.traffic(params)
            bench = Benchmark(params=dict(params), dtype=ctx.task.benchmark_dtype,
                              skipped=self.skips[i], nbytes=nbytes,
                              flops=ctx.task.flops(params, ctx.task.benchmark_dtype))
            if start[i] is None:
                bench.skipped = bench.skipped or f"the reference failed: {self.main.failure}"
            else:
                bench.reference = bench.reference_start = measurement.summarise([start[i]],
                                                                                nbytes)
                last = end[i] if end else None
                if last is not None:
                    bench.reference_end = measurement.summarise([last], nbytes)
                    bench.reference = measurement.summarise([start[i], last], nbytes)
                    bench.drift = measurement.drift(bench.reference_start, bench.reference_end)
                    if bench.drift:
                        drifted.append(f"{params_text(params)} {bench.drift}")
            if compiled and compiled[0][i]:
                bench.compiled = measurement.summarise([compiled[0][i]], nbytes)
            table.append(bench)
        if compiled and compiled[1]:
            notes.append(f"torch.compile of the reference failed, no speedups over it: "
                         f"{compiled[1]}")
        if end:
            notes += [f"the reference's process {w.name} failed during the run ({w.failure}); "
                      "shapes it could not time alongside a submission have no speedup for "
                      "that submission" for w in self.rounds if w.failure]
        if drifted:
            notes.append("the machine drifted: the reference timed at the end of the run "
                         "disagrees with its start beyond noise on " + "; ".join(drifted)
                         + ". Speedups are not affected as much: each divides reference "
                         "rounds taken alternately with the submission's.")
        return table, notes


def reference_log(ctx: Context) -> str:
    """The name the reference's processes' logs start with (its torch.compile's too)."""
    return f"{ctx.task.name.replace('/', '__')}.reference"


def unfit_cases(ctx: Context) -> list[str | None]:
    """Per benchmark case, why it cannot run here (unfit), if it cannot."""
    return [unfit(ctx, params) for params in ctx.benchmarks]


def unfit(ctx: Context, params: Params) -> str | None:
    """Why a benchmark case cannot run here: an input and an output being made and two kept
    for verification must fit, about twice the bytes one call's tensors hold."""
    need = 2 * ctx.task.held_bytes(params, ctx.task.benchmark_dtype)
    if ctx.device.type == "cuda":
        ctx.release()
        free, where = torch.cuda.mem_get_info(ctx.device)[0], "on the device"
    else:
        free = min(psutil.virtual_memory().available,
                   int(ctx.task.limits.host_memory_gib * 2**30))
        where = "in host memory (within limits.host_memory_gib)"
    if need > 0.9 * free:
        return f"needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free {where}"
    return None


