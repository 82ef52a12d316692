"""Where jobs run. A job (task, problem, submission and its hash, options) is a plain value
that can travel; an executor runs a list of them and hands back, through a Sink, each
problem's screening and reference table and each result the moment it is known.
LocalExecutor runs them on this machine's device; executors for several GPUs or a cluster
implement the same two methods."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from kbench import doctor, environment
from kbench.cases import CaseError
from kbench.discovery import Submission
from kbench.grading import building
from kbench.grading.context import Context, Say
from kbench.grading.options import Options
from kbench.grading.reference_pool import ReferencePool
from kbench.grading.screen import ProblemError, screen
from kbench.grading.slot import Slot
from kbench.grading.watch import Watcher
from kbench.guard import Presence
from kbench.protocol import Samples
from kbench.results import Benchmark, ProblemRun, SubmissionResult
from kbench.task import TaskError, load_task
from kbench.toolchain import find_toolchain
from kbench.verdict import Status


@dataclass(frozen=True)
class Job:
    task: str  # the task file's path
    problem: str  # the task's name in reports (l2norm, level1/19_ReLU)
    name: str  # the submission's name in reports
    path: str  # its file
    sha256: str  # of its bytes when the job was made
    options: dict  # Options.to_dict()

    @classmethod
    def make(cls, task: Path, problem: str, sub: Submission, options: Options) -> Job:
        return cls(task=str(task), problem=problem, name=sub.name, path=str(sub.path),
                   sha256=sub.sha256, options=options.to_dict())

    def submission(self) -> Submission:
        """The file, under the hash the job was made with: what its result is stored and
        reused under, even if the file changes while the run goes on."""
        sub = Submission(self.name, Path(self.path))
        sub.__dict__["sha256"] = self.sha256  # the cached_property's value, set
        return sub

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        return cls(**data)


class Sink(Protocol):
    def problem(self, problem: ProblemRun) -> None: ...

    def result(self, result: SubmissionResult) -> None: ...


class Executor(Protocol):
    def watch_store(self, presence: Presence) -> None:
        """The store's folder, shared with the process that writes it."""

    def environment(self) -> dict:
        """The machine the jobs run on, with ``problems`` (kbench.doctor) in it."""

    def run(self, jobs: list[Job], sink: Sink) -> None:
        """Grade every job; each result goes to ``sink`` as soon as it is known."""


class LocalExecutor:
    """This process's device: problem by problem, each screened, its submissions built in
    parallel, then evaluated one at a time against one reference pool."""

    def __init__(self, options: Options, say: Say = lambda line: None) -> None:
        self.options, self.say = options, say
        self.toolchain = find_toolchain(options.cuda_arch, options.cache_dir / "toolkits")
        self.watcher = Watcher(options)
        self.environment_problem: str | None = None
        self.copy_gbps: float | None = None  # measured once per run, by the first pool
        self.note_unwatched = True  # say at the end how often shared folders went unchecked

    def watch_store(self, presence: Presence) -> None:
        """The store's folder counts as shared with other kbench processes too."""
        self.watcher.add_presence(presence)

    def watch_out_dir(self) -> None:
        """The same, in a slot process (kbench.grading.units): the output folder is shared
        with the driver, which writes the store, and with the other slots."""
        self.watcher.add_presence(Presence(self.options.out_dir))

    def environment(self) -> dict:
        """The machine, as recorded with the run, with what kbench.doctor found wrong. A
        problem that stops CUDA builds is said once here and becomes each CUDA submission's
        environment_error (see kbench.backends)."""
        device = self.options.device.value
        env = environment.describe(device, self.toolchain)
        found = doctor.checks(device, self.toolchain, self.options.cache_dir)
        env["problems"] = [f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
                           for c in found if c.level is doctor.Level.PROBLEM]
        self.environment_problem = doctor.blocking(found)
        for line in env["problems"]:
            self.say(f"environment problem: {line}")
        return env

    def run(self, jobs: list[Job], sink: Sink) -> None:
        self.watcher.for_run([job.task for job in jobs], [job.path for job in jobs])
        groups: dict[tuple[str, str], list[Job]] = {}
        for job in jobs:
            groups.setdefault((job.task, job.problem), []).append(job)
        for (task_path, name), group in groups.items():
            ctx = self._problem(task_path, name, group, sink)
            if ctx is not None:
                self._grade(ctx, [job.submission() for job in group], sink)
        if self.watcher.unwatched and self.note_unwatched:
            self.say(f"note: other kbench processes used {self.options.out_dir} or the build "
                     f"cache in {self.watcher.unwatched} of this run's watch windows; writes "
                     "there by the submissions then running could not be told from theirs "
                     "and went unchecked")

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
                                notes=list(ctx.notes)))
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

    def _grade(self, ctx: Context, submissions: list[Submission], sink: Sink) -> None:
        self.watcher.for_task(ctx)
        self.say(f"{ctx.task.name}: building {len(submissions)} submission(s), "
                 f"{max(1, min(self.options.jobs, len(submissions)))} at a time")
        built = building.build_all(ctx, self.watcher, submissions, self.environment_problem)
        with ReferencePool(ctx, self.copy_gbps) as pool:
            reference, start, compiled = self._reference_at_start(pool, sink)
            slot, timed = Slot(ctx, self.watcher, pool), False
            for sub in submissions:
                result = slot.evaluate(sub, built[sub], reference)
                sink.result(result)
                timed = timed or any(b.candidate for b in result.benchmarks)
            if timed:  # the reference once more: did the machine drift meanwhile?
                self.say(f"{ctx.task.name}: timing the reference again (drift check)")
                table, notes = pool.table(start, pool.time_all(start), compiled)
                sink.problem(self._problem_run(ctx, table, pool, notes))
            self.copy_gbps = self.copy_gbps or pool.copy_gbps

    def _problem_run(self, ctx: Context, table: list[Benchmark], pool: ReferencePool,
                     notes: list[str]) -> ProblemRun:
        return ProblemRun(name=ctx.task.name, path=str(ctx.task.path), digest=ctx.task.digest,
                          notes=list(ctx.notes) + notes, reference=table,
                          copy_gbps=pool.copy_gbps)

    def _reference_at_start(self, pool: ReferencePool, sink: Sink
                            ) -> tuple[list[Benchmark], list[Samples | None],
                                       tuple[list[Samples | None], str | None] | None]:
        ctx = pool.ctx
        if not ctx.options.timed:
            sink.problem(self._problem_run(ctx, [], pool, [
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
        return reference, start, compiled
