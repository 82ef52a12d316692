"""One problem held open on this device while its submissions come: screened once, its reference
timed once, when the first submission that can run is about to be graded (torch.compile of it
too where the profile asks), its reference processes kept for each of its submissions graded
here in whatever order their builds land, and timed again for drift when it closes. Closed,
it keeps what it screened and timed: a submission graded later (again, alone at the end)
reopens its processes only. Its torch.compile baseline may be compiled ahead of its turn
(``compile_ahead``: the slot is told which problems come next), and every process of kbench's
readied on this device, any problem's, is stopped while anything is timed here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from kbench.grading.building.build import Built
from kbench.grading.building.watch import Watcher
from kbench.grading.channel import Channel
from kbench.grading.context import Context
from kbench.grading.jobs import Job, Sink
from kbench.grading.options import TimingMode
from kbench.grading.running.submission import Slot
from kbench.grading.timing import alternating, measurement
from kbench.grading.timing.compiled import Compiled
from kbench.grading.timing.reference_pool import ReferencePool, reference_log, unfit_cases
from kbench.host import activity, backends, spawn
from kbench.problems.discovery import Submission
from kbench.results.run_record import Benchmark, ProblemRun, SubmissionResult
from kbench.shared.protocol import Samples


class OpenProblem:
    """``ctx``: the problem screened on this device; ``copy_gbps``: the copy bandwidth where
    this run measured it already; ``readied``: kbench's processes readied ahead on this
    device, every problem's (kbench.grading.running.local), stopped while anything is timed."""

    def __init__(self, ctx: Context, watcher: Watcher, log: activity.Log,
                 copy_gbps: float | None,
                 readied: Callable[[], list[Channel]] = list) -> None:
        self.ctx, self.watcher, self.log = ctx, watcher, log
        self.readied = readied
        self.copy_gbps = copy_gbps
        self.pool: ReferencePool | None = None
        self.reference: list[Benchmark] | None = None  # None: not timed (yet)
        self.start: list[Samples | None] = []
        self.compiled: tuple[list[Samples | None], str | None] | None = None
        self.compiling: Compiled | None = None  # torch.compile of it, timed as it closes
        self.timed = False  # a submission was timed against it since it last opened
        self.graded: list[SubmissionResult] = []  # those, for their speedups over compile
        self.stage_s: dict[str, float] = {}  # seconds of the problem's own stages
        self.notes = [] if ctx.options.timed else [  # on its timing, beside screening's
            "timing skipped: --case selects correctness cases only" if ctx.options.case_indices
            else "timing skipped (--no-timing)"]

    @property
    def is_open(self) -> bool:
        """Its reference is timed and its processes are up (a submission graded now reuses
        them)."""
        return self.pool is not None and self.reference is not None

    @property
    def measured_copy_gbps(self) -> float | None:
        """The copy bandwidth its pool measured, else the run's it was given."""
        return self.pool.copy_gbps if self.pool else self.copy_gbps

    def record(self) -> ProblemRun:
        """Its record as the store keeps it, reference table included once timed."""
        ctx = self.ctx
        return ProblemRun(name=ctx.task.name, path=str(ctx.task.path), digest=ctx.task.digest,
                          notes=list(ctx.notes) + self.notes,
                          reference=self.reference or [],
                          copy_gbps=self.measured_copy_gbps,
                          degenerate="; ".join(ctx.degenerate) or None,
                          stage_s=dict(self.stage_s))

    def grade(self, job: Job, built: Built, sink: Sink, defer: Callable[[Job], None] | None,
              upcoming: Submission | None) -> None:
        """One submission of the problem to its result (into ``sink``), or to ``defer``
        (kbench.grading.running.submission.Slot.evaluate says when)."""
        if self.pool is None:
            self.pool = ReferencePool(self.ctx, self.copy_gbps)
        if self.reference is None and self.ctx.options.timed and _runnable(self.ctx, job, built):
            self._time_reference(sink)
        self.watcher.for_task(self.ctx)
        slot = Slot(self.ctx, self.watcher, self.pool, self.readied)
        result = slot.evaluate(job.submission(), built, self.reference or [], upcoming,
                               can_defer=defer is not None, retimed=job.retimed)
        if result is None:
            defer(replace(job, retimed=slot.deferred))
            return
        sink.result(result)
        if any(b.candidate for b in result.benchmarks):
            self.timed = True
            self.graded.append(result)

    def ahead(self) -> list[Channel]:
        """The torch.compile baseline's process while it is readied ahead (its compiling and
        autotuning run on the device)."""
        ahead = self.compiling.ahead if self.compiling is not None else None
        return [ahead.channel] if ahead is not None else []

    def compile_ahead(self) -> None:
        """Its torch.compile baseline, where the profile times one: compiled from now on where
        the run has spare cores (else when it closes). Called ahead of the problem's turn
        too: on one H200 the bundled set's problems each waited 10-14 s for theirs as they
        closed, most of it compiling, when it began only as they opened."""
        ctx = self.ctx
        if self.compiling is None and self.compiled is None and ctx.options.timed and \
                ctx.options.rigour.compile_baseline and \
                ctx.task.timing[ctx.device.type].compile_reference:
            skips = self.pool.skips if self.pool is not None else unfit_cases(ctx)
            self.compiling = Compiled(ctx, reference_log(ctx), skips)
            self.compiling.start()

    def close(self, sink: Sink) -> None:
        """Its processes ended, the reference timed again first where a submission was timed
        against it (did the machine drift meanwhile?), and its record stored."""
        spawn.drop_spares()
        if self.pool is None:  # opened ahead of its turn only (compile_ahead)
            self._end_compiling()
            return
        ctx, pool = self.ctx, self.pool
        try:
            if self.compiling is not None and self.timed:
                ctx.say(f"{ctx.task.name}: timing torch.compile of the reference")
                own = self.ahead()
                with self._stage("torch.compile"), self.log.record(
                        "timing", f"{ctx.task.name}/reference"), alternating.all_frozen(
                        c for c in self.readied() if c not in own):
                    self.compiled = self.compiling.time()
            late = [r for r in self.graded if r.compile_speedup is None]
            if self.compiled and late:  # timed after them: their speedups over it now
                table = pool.table(self.start, None, self.compiled)[0]
                for result in late:
                    if measurement.add_compile_speedups(result, table):
                        sink.revised(result)
            if self.timed:
                ctx.say(f"{ctx.task.name}: timing the reference again (drift check)")
                with self._stage("drift check"), self.log.record(
                        "timing", f"{ctx.task.name}/reference"), \
                        alternating.all_frozen(self.readied()):
                    self.reference, self.notes = pool.table(
                        self.start, pool.time_all(self.start), self.compiled)
            elif self.reference is None and ctx.options.timed:
                self.notes = ["timing skipped: no submission of this problem can run here "
                              "(each failed to build or import, or was skipped)"]
            sink.problem(self.record())
        finally:
            self._end_compiling()
            self.copy_gbps = pool.copy_gbps or self.copy_gbps
            pool.__exit__(None, None, None)
            self.pool, self.timed, self.graded = None, False, []
            ctx.forget()

    def reset(self) -> None:
        """Its processes ended and its reference to be timed again by new ones, without a
        drift check: they may have loaded its files while a build had changed them."""
        if self.pool is not None:
            self.pool.__exit__(None, None, None)
        self._end_compiling()
        self.pool, self.reference, self.timed, self.graded = None, None, False, []

    def _end_compiling(self) -> None:
        if self.compiling is not None:
            self.compiling.close()
            self.compiling = None

    def _time_reference(self, sink: Sink) -> None:
        """The reference (and torch.compile of it) timed on every benchmark case, then the
        processes the submissions' timing will open started (they would disturb it)."""
        ctx, pool = self.ctx, self.pool
        pool.plan()
        ctx.say(f"{ctx.task.name}: timing the reference on {len(ctx.benchmarks)} shape(s) "
                f"({ctx.options.timing.value})")
        with self.log.record("timing", f"{ctx.task.name}/reference"), \
                self._stage("reference"), alternating.all_frozen(self.readied()):
            self.start = pool.time_all()
        self.compile_ahead()  # unless it was already
        self.reference, self.notes = pool.table(self.start, None, self.compiled)
        sink.problem(self.record())
        pool.prestart(bool(alternating.fresh_cases(ctx, self.reference)),
                      eager=ctx.options.timing is TimingMode.EAGER)

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.stage_s[name] = round(self.stage_s.get(name, 0.0) + time.monotonic() - start,
                                       2)


def _runnable(ctx: Context, job: Job, built: Built) -> bool:
    """Whether ``job`` built and can run on this device (then the reference is timed for it)."""
    if built.verdict is not None:
        return False
    source = job.submission().path.read_text(errors="replace")
    return backends.for_source(source).cannot_run(ctx.device.type, ctx.toolchain) is None
