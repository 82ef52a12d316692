"""Where jobs run. A job (task, submission and its hash, options) is a plain value that can
travel; an executor runs a list of them and hands back, through a Sink, the reference table
and each result the moment it is known. LocalExecutor runs them on this machine's device;
executors for several GPUs or a cluster implement the same two methods."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kbench import doctor, environment
from kbench.discovery import Submission
from kbench.grading import building
from kbench.grading.context import Context, Say
from kbench.grading.options import Options
from kbench.grading.reference_pool import ReferencePool
from kbench.grading.slot import Slot
from kbench.grading.watch import Watcher
from kbench.guard import Presence
from kbench.protocol import Samples
from kbench.results import Benchmark, SubmissionResult
from kbench.task import Task


@dataclass(frozen=True)
class Job:
    task: str  # the task file's path
    name: str  # the submission's name in reports
    path: str  # its file
    sha256: str  # of its bytes when the job was made
    options: dict  # Options.to_dict()

    @classmethod
    def make(cls, task: Task, sub: Submission, options: Options) -> Job:
        return cls(task=str(task.path), name=sub.name, path=str(sub.path), sha256=sub.sha256,
                   options=options.to_dict())

    def submission(self) -> Submission:
        """The file, under the hash the job was made with: what its result is stored and
        reused under, even if the file changes while the run goes on."""
        sub = Submission(self.name, Path(self.path))
        sub.__dict__["sha256"] = self.sha256  # the cached_property's value, set
        return sub

    def to_dict(self) -> dict:
        return {"task": self.task, "name": self.name, "path": self.path,
                "sha256": self.sha256, "options": self.options}

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        return cls(**data)


class Sink(Protocol):
    def reference(self, table: list[Benchmark], copy_gbps: float | None,
                  notes: list[str]) -> None: ...

    def result(self, result: SubmissionResult) -> None: ...


class Executor(Protocol):
    def environment(self) -> dict:
        """The machine the jobs run on, with ``problems`` (kbench.doctor) in it."""

    def run(self, jobs: list[Job], sink: Sink) -> None:
        """Grade every job; each result goes to ``sink`` as soon as it is known."""


class LocalExecutor:
    """This process's device: builds in parallel, then one submission at a time, with one
    reference pool for the whole list."""

    def __init__(self, task: Task, options: Options, say: Say = lambda line: None) -> None:
        self.ctx = Context.create(task, options, say)
        self.watcher = Watcher(self.ctx)
        self.environment_problem: str | None = None

    def watch_store(self, presence: Presence) -> None:
        """The store's folder counts as shared with other kbench processes too."""
        self.watcher.add_presence(presence)

    def environment(self) -> dict:
        """The machine, as recorded with the run, with what kbench.doctor found wrong. A
        problem that stops CUDA builds is said once here and becomes each CUDA submission's
        environment_error (see kbench.backends)."""
        ctx = self.ctx
        env = environment.describe(ctx.device.type, ctx.toolchain)
        found = doctor.checks(ctx.device.type, ctx.toolchain, ctx.options.cache_dir)
        env["problems"] = [f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
                           for c in found if c.level is doctor.Level.PROBLEM]
        self.environment_problem = doctor.blocking(found)
        for line in env["problems"]:
            ctx.say(f"environment problem: {line}")
        return env

    def run(self, jobs: list[Job], sink: Sink) -> None:
        ctx = self.ctx
        if any(Path(job.task) != ctx.task.path for job in jobs):
            raise ValueError("LocalExecutor runs the jobs of the task it was made for")
        submissions = [job.submission() for job in jobs]
        ctx.say(f"building {len(submissions)} submission(s), "
                f"{max(1, min(ctx.options.jobs, len(submissions)))} at a time")
        built = building.build_all(ctx, self.watcher, submissions, self.environment_problem)
        with ReferencePool(ctx) as pool:
            reference, start, compiled = self._reference_at_start(pool, sink)
            slot, timed = Slot(ctx, self.watcher, pool), False
            for sub in submissions:
                result = slot.evaluate(sub, built[sub], reference)
                sink.result(result)
                timed = timed or any(b.candidate for b in result.benchmarks)
            if timed:  # the reference once more: did the machine drift meanwhile?
                ctx.say("timing the reference again (drift check)")
                table, notes = pool.table(start, pool.time_all(start), compiled)
                sink.reference(table, pool.copy_gbps, notes)
        if self.watcher.unwatched:
            ctx.say(f"note: other kbench processes used {ctx.options.out_dir} or the build "
                    f"cache in {self.watcher.unwatched} of this run's watch windows; writes "
                    "there by the submissions then running could not be told from theirs and "
                    "went unchecked")

    def _reference_at_start(self, pool: ReferencePool, sink: Sink
                            ) -> tuple[list[Benchmark], list[Samples | None],
                                       tuple[list[Samples | None], str | None] | None]:
        ctx = self.ctx
        if not ctx.options.timed:
            sink.reference([], None, ["timing skipped: --case selects correctness cases only"])
            return [], [], None
        pool.plan()
        ctx.say(f"timing the reference on {len(ctx.benchmarks)} shape(s) "
                f"({ctx.options.timing.value})")
        start, compiled = pool.time_all(), None
        if ctx.task.timing[ctx.device.type].compile_reference:
            ctx.say("timing torch.compile of the reference")
            compiled = pool.time_compiled()
        reference, notes = pool.table(start, None, compiled)
        sink.reference(reference, pool.copy_gbps, notes)
        return reference, start, compiled


