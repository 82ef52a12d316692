"""This machine's device as an executor (kbench.grading.jobs): every build first on the host's
build pipeline (kbench.grading.building.pipeline), or the builds a slot's unit brings, then problem
by problem, each screened and its reference timed, its submissions graded one at a time."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import replace

from kbench import sandbox
from kbench.grading.building import build, hostsplit
from kbench.grading.building.build import Built
from kbench.grading.building.pipeline import Pipeline
from kbench.grading.building.watch import Watcher, tampered
from kbench.grading.checking.screen import ProblemError, screen
from kbench.grading.context import Context, Say
from kbench.grading.jobs import Job, Sink
from kbench.grading.options import Options, TimingMode
from kbench.grading.running.submission import Slot
from kbench.grading.timing import alternating
from kbench.grading.timing.reference_pool import ReferencePool
from kbench.host import activity, backends, doctor, environment
from kbench.host.toolchain import find_toolchain
from kbench.problems.cases import CaseError
from kbench.problems.load import load_task
from kbench.problems.task import TaskError
from kbench.results.presence import Presence
from kbench.results.run_record import Benchmark, ProblemRun, SubmissionResult
from kbench.results.verdict import Status
from kbench.shared.protocol import Samples

Builds = Callable[[list[Job]], dict[str, Built | None]]  # a problem's builds, by path


class LocalExecutor:
    """This process's device: problem by problem, each screened, its submissions evaluated
    one at a time against one reference pool."""

    def __init__(self, options: Options, say: Say = lambda line: None, pin: bool = True
                 ) -> None:
        """``pin``: this process owns the host (kbench grade on one device), so timing and
        builds get cores of their own (kbench.grading.building.hostsplit); not in a slot process or
        a Ray task."""
        self.options, self.say = options, say
        self.split = hostsplit.plan(1, options.device, options.jobs) if pin else \
            hostsplit.unsplit(1, options.jobs)
        self.toolchain = find_toolchain(options.cuda_arch, options.cache_dir / "toolkits")
        self.watcher = Watcher(options)
        self.environment_problem: str | None = None
        self.copy_gbps: float | None = None  # measured once per run, by the first pool
        self.note_unwatched = True  # say at the end how often shared folders went unchecked
        self.notes: list[str] = []  # what the run's reports say about the grading itself
        self.activity = activity.Log(options.cache_dir)  # what timings beside this one see

    def watch_store(self, presence: Presence) -> None:
        """The store's folder counts as shared with other kbench processes too."""
        self.watcher.add_presence(presence)

    def watch_out_dir(self) -> None:
        """The same, in a slot process (kbench.grading.running.units): the output folder is shared
        with the driver, which writes the store, and with the other slots."""
        self.watcher.add_presence(Presence(self.options.out_dir))

    def environment(self) -> dict:
        """The machine, as recorded with the run, with what kbench.host.doctor found wrong. A
        problem that stops CUDA builds is said once here and becomes each CUDA submission's
        environment_error (see kbench.host.backends)."""
        device = self.options.device.value
        env = environment.describe(device, self.toolchain)
        found = doctor.checks(device, self.toolchain, self.options.cache_dir)
        env["problems"] = [f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
                           for c in found if c.level is doctor.Level.PROBLEM]
        self.environment_problem = doctor.blocking(found)
        for line in env["problems"]:
            self.say(f"environment problem: {line}")
        env["host_split"] = self.split.to_dict()
        return env

    def run(self, jobs: list[Job], sink: Sink, built: dict[str, Built] | None = None,
            defer: Callable[[Job], None] | None = None) -> None:
        """Grade ``jobs``. ``built``: what was built for them elsewhere (the driver's pipeline
        for a slot's unit, kbench.grading.running.slots; Ray build nodes, ray_tasks), and
        ``defer`` where a job goes whose grading saw kbench's files change beside those builds
        (the driver grades it again at the end); without them, a pipeline here builds the jobs
        first."""
        self.watcher.for_run([job.task for job in jobs], [job.path for job in jobs])
        if built is not None:
            self._problems(jobs, sink, lambda group: {j.path: built.get(j.path) for j in group},
                           defer)
        else:
            self._with_pipeline(jobs, sink)
        if (note := self.watcher.unwatched_note()) and self.note_unwatched:
            self.say(f"note: {note}")
            self.notes.append(note)

    def _with_pipeline(self, jobs: list[Job], sink: Sink) -> None:
        """Every build first, on the pool's cores, then grading (on the timing cores): in one
        process a grading window beside running builds could not tell their writes from its
        submission's. A suspect of the pool's window is built again alone and graded last."""
        ordered = [job for group in _groups(jobs).values() for job in group]
        deferred: list[Job] = []  # timing flags raised on a disturbed host: timed again
        with Pipeline(self.options, self.toolchain, self.environment_problem, self.split,
                      self.say) as pipeline, _pinned(self.split.timing[0]):
            pipeline.start(ordered)
            pipeline.finish()
            self._problems(ordered, sink, pipeline.wait, deferred.append)
            suspects = pipeline.suspects()
            if suspects or deferred:
                built = {**pipeline.built(), **(pipeline.settle() if suspects else {})}
                if deferred:
                    self.say(f"timing {len(deferred)} submission(s) again, alone: their "
                             "flags were raised while the host was disturbed")
                self._problems(suspects + deferred, sink,
                               lambda group: {j.path: built.get(j.path) for j in group}, None)

    def _problems(self, jobs: list[Job], sink: Sink, builds: Builds,
                  defer: Callable[[Job], None] | None) -> None:
        for (task_path, name), group in _groups(jobs).items():
            ctx = self._problem(task_path, name, group, sink)
            if ctx is not None:
                self._grade(ctx, group, builds, sink, defer)

    def _problem(self, task_path: str, name: str, jobs: list[Job], sink: Sink
                 ) -> Context | None:
        """The problem loaded and screened here; None (each job a task_error) if it cannot
        be graded. Raises CaseError for a ``--case`` the plan does not have."""
        try:
            task = load_task(task_path, name)
            self.say(f"{name}: screening the reference on its cases")
            ctx = Context.create(task, self.options, self.toolchain, self.say)
            screen(ctx)
        except CaseError:
            raise
        except (TaskError, ProblemError) as exc:
            self._failed(name, task_path, str(exc), jobs, sink)
            return None
        except Exception as exc:  # a problem that breaks kbench's own handling of it
            self._failed(name, task_path, f"{task_path}: {type(exc).__name__}: {exc}", jobs,
                         sink)
            return None
        sink.problem(ProblemRun(name=name, path=str(task.path), digest=task.digest,
                                notes=list(ctx.notes), degenerate=_degenerate(ctx)))
        return ctx

    def _failed(self, name: str, task_path: str, error: str, jobs: list[Job],
                sink: Sink) -> None:
        self.say(f"problem error: {error}")
        sink.problem(ProblemRun(name=name, path=task_path, digest="", error=error))
        for job in jobs:
            sink.result(SubmissionResult(
                name=job.name, path=job.path, sha256=job.sha256, status=Status.TASK_ERROR,
                reason=f"not graded: the problem {name} cannot be graded ({error})",
                problem=name))

    def _grade(self, ctx: Context, jobs: list[Job], builds: Builds, sink: Sink,
               defer: Callable[[Job], None] | None) -> None:
        self.watcher.for_task(ctx)
        with ReferencePool(ctx, self.copy_gbps) as pool:
            built = self._built(ctx, jobs, builds(jobs))
            with self.activity.record("timing", f"{ctx.task.name}/reference"):
                reference, start, compiled = self._reference_at_start(
                    pool, sink, _runnable(ctx, [j for j in jobs if j.path in built], built))
            slot, timed = Slot(ctx, self.watcher, pool), False
            jobs = [job for job in jobs if job.path in built]  # the rest: graded at the end
            try:
                for k, job in enumerate(jobs):
                    upcoming = next((j.submission() for j in jobs[k + 1:k + 2]
                                     if built[j.path].verdict is None), None)
                    result = slot.evaluate(job.submission(), built[job.path], reference,
                                           upcoming, can_defer=defer is not None,
                                           retimed=job.retimed)
                    if result is None:
                        defer(replace(job, retimed=slot.deferred))
                        continue
                    sink.result(result)
                    timed = timed or any(b.candidate for b in result.benchmarks)
            finally:
                sandbox.drop_spares()
            if timed:  # the reference once more: did the machine drift meanwhile?
                self.say(f"{ctx.task.name}: timing the reference again (drift check)")
                with self.activity.record("timing", f"{ctx.task.name}/reference"):
                    table, notes = pool.table(start, pool.time_all(start), compiled)
                sink.problem(self._problem_run(ctx, table, pool, notes))
            self.copy_gbps = self.copy_gbps or pool.copy_gbps

    def _built(self, ctx: Context, jobs: list[Job], built: dict[str, Built | None]
               ) -> dict[str, Built]:
        """The pipeline's builds; one it did not make (its problem did not load there) is
        made here, watched."""
        made = {}
        for path, b in built.items():
            if b is None:
                sub = next(j for j in jobs if j.path == path).submission()
                changed = self.watcher.watch([sub.path], [ctx.logs, build.folder(ctx, sub)])
                b = build.build(ctx, sub, self.environment_problem,
                                self.split.cores_per_build())
                if lines := changed().lines:
                    b = Built(tampered("while building", lines), b.seconds)
            made[path] = b
        return made

    def _problem_run(self, ctx: Context, table: list[Benchmark], pool: ReferencePool,
                     notes: list[str]) -> ProblemRun:
        return ProblemRun(name=ctx.task.name, path=str(ctx.task.path), digest=ctx.task.digest,
                          notes=list(ctx.notes) + notes, reference=table,
                          copy_gbps=pool.copy_gbps, degenerate=_degenerate(ctx))

    def _reference_at_start(self, pool: ReferencePool, sink: Sink, runnable: bool
                            ) -> tuple[list[Benchmark], list[Samples | None],
                                       tuple[list[Samples | None], str | None] | None]:
        """The reference (and torch.compile of it) timed, unless the run is untimed or no
        submission of the problem can run here (``runnable``): nothing would divide it."""
        ctx = pool.ctx
        if not ctx.options.timed or not runnable:
            sink.problem(self._problem_run(ctx, [], pool, [
                "timing skipped: no submission of this problem can run here (each failed to "
                "build or import, or was skipped)" if ctx.options.timed else
                "timing skipped: --case selects correctness cases only"
                if ctx.options.case_indices else "timing skipped (--no-timing)"]))
            return [], [], None
        pool.plan()
        self.say(f"{ctx.task.name}: timing the reference on {len(ctx.benchmarks)} shape(s) "
                 f"({ctx.options.timing.value})")
        start, compiled = pool.time_all(), None
        if ctx.task.timing[ctx.device.type].compile_reference and \
                ctx.options.rigour.compile_baseline:
            self.say(f"{ctx.task.name}: timing torch.compile of the reference")
            compiled = pool.time_compiled()
        reference, notes = pool.table(start, None, compiled)
        sink.problem(self._problem_run(ctx, reference, pool, notes))
        pool.prestart(bool(alternating.fresh_cases(ctx, reference)),
                      eager=ctx.options.timing is TimingMode.EAGER)
        return reference, start, compiled


def _runnable(ctx: Context, jobs: list[Job], built: dict[str, Built]) -> bool:
    """Whether any of ``jobs`` built and can run on this device (then it may be timed)."""
    for job in jobs:
        if built[job.path].verdict is not None:
            continue
        source = job.submission().path.read_text(errors="replace")
        if backends.for_source(source).cannot_run(ctx.device.type, ctx.toolchain) is None:
            return True
    return False


def _degenerate(ctx: Context) -> str | None:
    return "; ".join(ctx.degenerate) or None


def _groups(jobs: list[Job]) -> dict[tuple[str, str], list[Job]]:
    """The jobs by problem, in the order problems first appear."""
    groups: dict[tuple[str, str], list[Job]] = {}
    for job in jobs:
        groups.setdefault((job.task, job.problem), []).append(job)
    return groups


@contextlib.contextmanager
def _pinned(cores: tuple[int, ...]) -> Iterator[None]:
    """This process (and every worker it starts) on ``cores`` meanwhile; () leaves it be."""
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
