"""This machine's device as an executor (kbench.grading.jobs): every build first on the host's
build pipeline (kbench.grading.building.pipeline), or the builds a slot's unit brings; each
problem screened and its reference timed once on this device, and held open while its
submissions come, in one unit or several (kbench.grading.running.open_problem)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

import psutil
import torch

from kbench.grading.building import build, hostsplit
from kbench.grading.building.build import Built
from kbench.grading.building.pipeline import Pipeline
from kbench.grading.building.watch import Watcher, tampered
from kbench.grading.channel import Channel
from kbench.grading.checking.screen import ProblemError, screen
from kbench.grading.context import Context, Say, Spare
from kbench.grading.jobs import Job, Sink
from kbench.grading.options import Options
from kbench.grading.running.open_problem import OpenProblem
from kbench.host import activity, doctor, environment, spawn
from kbench.host.toolchain import find_toolchain
from kbench.problems.cases import CaseError
from kbench.problems.discovery import Submission
from kbench.problems.load import load_task
from kbench.problems.task import TaskError
from kbench.results.presence import Presence
from kbench.results.run_record import ProblemRun, SubmissionResult
from kbench.results.verdict import Status
from kbench.sandbox import child_env

# Problems held open at once (each with its reference's processes and their device memory);
# the least recently used is closed first, its screening and reference figures kept.
_HELD_OPEN = 3


class LocalExecutor:
    """This process's device: submissions graded one at a time, each against its problem
    held open here."""

    def __init__(self, options: Options, say: Say = lambda line: None, pin: bool = True
                 ) -> None:
        """``pin``: this process owns the host (kbench grade on one device), so timing and
        builds get cores of their own (kbench.grading.building.hostsplit); not in a slot process or
        a Ray task."""
        self.options, self.say = options, say
        self.split = hostsplit.plan(1, options.device, options.jobs) if pin else \
            hostsplit.unsplit(1, options.jobs)
        # Where work ahead of its turn runs: the build cores of a host split here (a slot is
        # told its run's: kbench.grading.running.units).
        self.spare = Spare(self.split.build, self.split.nice) if self.split.split else None
        self.toolchain = find_toolchain(options.cuda_arch, options.cache_dir / "toolkits")
        self.watcher = Watcher(options)
        self.environment_problem: str | None = None
        self.copy_gbps: float | None = None  # measured once per run, by the first pool
        self.note_unwatched = True  # say at the end how often shared folders went unchecked
        self.notes: list[str] = []  # what the run's reports say about the grading itself
        self.activity = activity.Log(options.cache_dir)  # what timings beside this one see
        # Each problem met, by (task, name): held open (or closed, kept for a later
        # submission), or why it cannot be graded.
        self.problems: dict[tuple[str, str], OpenProblem | str] = {}
        self.repairs = 0  # the pipeline's repairs seen so far (_after_repairs)
        # The records of problems opened ahead of their turn (prepare), not yet given.
        self.unsaid: dict[tuple[str, str], ProblemRun] = {}

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
            defer: Callable[[Job], None] | None = None, close: bool = True) -> None:
        """Grade ``jobs``. ``built``: what was built for them elsewhere (the driver's pipeline
        for a slot's unit, kbench.grading.running.slots; Ray build nodes, ray_tasks), and
        ``defer`` where a job goes whose grading saw kbench's files change beside those builds
        (the driver grades it again at the end); without them, a pipeline here builds every
        job first. ``close``: the jobs' problems are closed after them (else they
        stay open for more of their submissions: ``finish`` closes them)."""
        self.watcher.for_run([job.task for job in jobs], [job.path for job in jobs])
        if built is not None:
            for job in jobs:
                self._after_repairs()
                self._one(job, built.get(job.path), sink, defer, None)
            if close:
                self.finish(sink, {(job.task, job.problem) for job in jobs})
        else:
            self._with_pipeline(jobs, sink, close)
        if (note := self.watcher.unwatched_note()) and self.note_unwatched:
            self.say(f"note: {note}")
            self.notes.append(note)

    def prepare(self, jobs: list[Job]) -> None:
        """The problems of ``jobs``, graded here next as far as the driver knows (a slot's
        unit says: kbench.grading.running.slots), screened now and their torch.compile
        baselines compiled on the spare cores meanwhile, where the run has them (else
        nothing is done ahead). Their records wait for a submission of theirs graded here:
        another slot may grade them instead, and the driver keeps the first slot's record
        of a problem (kbench.grading.running.units.Delivery)."""
        if self.spare is None:
            return
        for job in jobs:
            key = (job.task, job.problem)
            with contextlib.suppress(CaseError):  # said when the job itself is graded
                if key not in self.problems and isinstance(
                        problem := self._open(job, _Unsaid(self.unsaid, key)), OpenProblem) \
                        and _small(problem.ctx):
                    problem.compile_ahead()

    def _readied(self) -> list[Channel]:
        """Every process readied ahead on this device, each problem's: stopped while anything
        is timed here."""
        return [c for p in self.problems.values() if isinstance(p, OpenProblem)
                for c in p.ahead()]

    def finish(self, sink: Sink, keys: set[tuple[str, str]] | None = None) -> None:
        """Close the open problems (those of ``keys``): each one's drift check and record."""
        for key, problem in self.problems.items():
            if (keys is None or key in keys) and isinstance(problem, OpenProblem):
                problem.close(sink)
                self.copy_gbps = self.copy_gbps or problem.copy_gbps

    def _with_pipeline(self, jobs: list[Job], sink: Sink, close: bool) -> None:
        """Every build first, on the pool's cores, then grading (on the timing cores): in one
        process a grading window beside running builds could neither tell their writes from
        its submission's nor keep its workers from loading what a build had just changed (a
        problem file rewritten, a build of the same code in the folder they load from). With
        several slots, grading goes beside the builds (kbench.grading.running.slots). A
        suspect of the pool's window is built again alone and graded last, and so is a job
        whose timing raised a flag while the host was disturbed."""
        ordered = [job for group in _groups(jobs).values() for job in group]
        deferred: list[Job] = []
        with Pipeline(self.options, self.toolchain, self.environment_problem, self.split,
                      self.say) as pipeline, _pinned(self.split.timing[0]):
            pipeline.start(ordered)
            pipeline.finish()
            spawn.close_zygotes()  # what a zygote imported while builds ran is not relied on
            built = pipeline.built()
            for key, group in _groups(ordered).items():
                ready = [job for job in group if job.path in built]  # suspects: at the end
                for k, job in enumerate(ready):
                    upcoming = next((j.submission() for j in ready[k + 1:k + 2]
                                     if _runs(built[j.path])), None)
                    self._one(job, built[job.path], sink, deferred.append, upcoming)
                if close:
                    self.finish(sink, {key})
            suspects = pipeline.suspects()
            if suspects or deferred:
                built = {**built, **(pipeline.settle() if suspects else {})}
                if deferred:
                    self.say(f"timing {len(deferred)} submission(s) again, alone: their "
                             "flags were raised while the host was disturbed")
                for job in suspects + deferred:
                    self._one(job, built.get(job.path), sink, None, None)
                if close:
                    self.finish(sink)

    def _after_repairs(self) -> None:
        """Where the build pipeline beside this process (a slot's: the driver's) has put
        kbench's files right since the last look, whatever was started meanwhile may have
        loaded them changed: the zygotes, the spares, the open problems' reference processes
        (timed again from new ones) go."""
        repairs = self.watcher.builds.repairs()
        if repairs != self.repairs:
            self.repairs = repairs
            spawn.drop_spares()
            spawn.close_zygotes()
            for problem in self.problems.values():
                if isinstance(problem, OpenProblem):
                    problem.reset()

    def _one(self, job: Job, built: Built | None, sink: Sink,
             defer: Callable[[Job], None] | None, upcoming: Submission | None) -> None:
        """One job graded on its problem (opened here if it is not yet); a problem that
        cannot be graded gives it task_error."""
        key, problem = (job.task, job.problem), self._open(job, sink)
        if (record := self.unsaid.pop(key, None)) is not None:
            sink.problem(record)  # opened ahead of its turn (prepare)
        if isinstance(problem, str):
            sink.result(_task_error(job, problem))
            return
        self.problems[key] = self.problems.pop(key)  # the latest used last
        opened = [p for p in self.problems.values() if isinstance(p, OpenProblem) and p.is_open]
        for other in opened[:max(0, len(opened) - _HELD_OPEN + (not problem.is_open))]:
            other.close(sink)  # the least recently used: its processes and memory back
        problem.grade(job, self._built(problem.ctx, job, built), sink, defer, upcoming)
        # as soon as measured, not only as it closes: a kbench serve session holds its
        # problems open, and each opened after the first measured it again (2-3 s on 2 cores)
        self.copy_gbps = self.copy_gbps or problem.measured_copy_gbps

    def _open(self, job: Job, sink: Sink) -> OpenProblem | str:
        """The job's problem, loaded and screened here the first time (its record stored);
        why it cannot be graded, if it cannot. Raises CaseError for a ``--case`` the plan
        does not have."""
        key, name = (job.task, job.problem), job.problem
        if key not in self.problems:
            started = time.monotonic()
            try:
                task = load_task(job.task, name)
                self.say(f"{name}: screening the reference on its cases")
                ctx = Context.create(task, self.options, self.toolchain, self.say)
                ctx.spare = self.spare
                for env in (child_env({}), build.env(ctx, job.submission())):
                    spawn.warm(env)  # the workers of both sides, forked from now on
                screen(ctx)
            except CaseError:
                raise
            except (TaskError, ProblemError) as exc:
                return self._failed(key, job.task, str(exc), sink)
            except Exception as exc:  # a problem that breaks kbench's own handling of it
                return self._failed(key, job.task, f"{job.task}: {type(exc).__name__}: {exc}",
                                    sink)
            problem = OpenProblem(ctx, self.watcher, self.activity, self.copy_gbps,
                                  self._readied)
            problem.stage_s["screening"] = round(time.monotonic() - started, 2)
            sink.problem(problem.record())
            self.problems[key] = problem
        return self.problems[key]

    def _failed(self, key: tuple[str, str], task_path: str, error: str, sink: Sink) -> str:
        self.say(f"problem error: {error}")
        sink.problem(ProblemRun(name=key[1], path=task_path, digest="", error=error))
        self.problems[key] = error
        return error

    def _built(self, ctx: Context, job: Job, built: Built | None) -> Built:
        """The job's build; one the pipeline did not make (its problem did not load there)
        is made here, watched."""
        if built is not None:
            return built
        sub = job.submission()
        changed = self.watcher.watch([sub.path], [ctx.logs, build.folder(ctx, sub)])
        made = build.build(ctx, sub, self.environment_problem, self.split.cores_per_build())
        if lines := changed().lines:
            return Built(tampered("while building", lines), made.seconds)
        return made


class _Unsaid:
    """The sink a problem opened ahead of its turn is screened into: its record is kept."""

    def __init__(self, into: dict[tuple[str, str], ProblemRun], key: tuple[str, str]) -> None:
        self.into, self.key = into, key

    def problem(self, problem: ProblemRun) -> None:
        self.into[self.key] = problem


# Device memory a problem compiled ahead of its turn may hold while others are graded (its
# largest benchmark case's tensors, twice over), as a share of the device's: a submission of
# another problem must not run short of memory for kbench's work ahead.
_AHEAD_SHARE = 0.05


def _small(ctx: Context) -> bool:
    need = 2 * max((ctx.task.held_bytes(p, ctx.task.benchmark_dtype) for p in ctx.benchmarks),
                   default=0)
    total = torch.cuda.get_device_properties(ctx.device).total_memory \
        if ctx.device.type == "cuda" else psutil.virtual_memory().total
    return need <= _AHEAD_SHARE * total


def _runs(built: Built | None) -> bool:
    return built is not None and built.verdict is None


def _task_error(job: Job, error: str) -> SubmissionResult:
    return SubmissionResult(name=job.name, path=job.path, sha256=job.sha256,
                            status=Status.TASK_ERROR, problem=job.problem,
                            reason=f"not graded: the problem {job.problem} cannot be graded "
                                   f"({error})")


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
