"""Where jobs run. A job (task, problem, submission and its hash, options) is a plain value
that can travel; an executor runs a list of them and hands back, through a Sink, each
problem's screening and reference table and each result the moment it is known.
kbench.grading.running.local's LocalExecutor runs them on this machine's device; executors for
several GPUs (kbench.grading.running.slots) or a cluster (kbench.grading.running.cluster) implement
the same three methods."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

from kbench.grading.options import Options
from kbench.problems.discovery import Submission
from kbench.results.presence import Presence
from kbench.results.run_record import ProblemRun, SubmissionResult


@dataclass(frozen=True)
class Job:
    task: str  # the task file's path
    problem: str  # the task's name in reports (l2norm, level1/19_ReLU)
    name: str  # the submission's name in reports
    path: str  # its file
    sha256: str  # of its bytes when the job was made
    options: Options
    # Why it is graded again alone at the end: the flag its timing raised while the host was
    # disturbed (kbench.grading.timing.disturbance); "" the first time.
    retimed: str = ""

    @classmethod
    def make(cls, task: Path, problem: str, sub: Submission, options: Options) -> Job:
        return cls(task=str(task), problem=problem, name=sub.name, path=str(sub.path),
                   sha256=sub.sha256, options=options)

    def submission(self) -> Submission:
        """The file, under the hash the job was made with: what its result is stored and
        reused under, even if the file changes while the run goes on."""
        sub = Submission(self.name, Path(self.path))
        sub.__dict__["sha256"] = self.sha256  # the cached_property's value, set
        return sub

    def to_dict(self) -> dict:
        """Plain data, for a slot process or a Ray task (``from_dict`` on the other side)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "options": self.options.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        return cls(**{**data, "options": Options.from_dict(data["options"])})


class Sink(Protocol):
    def problem(self, problem: ProblemRun) -> None: ...

    def result(self, result: SubmissionResult) -> None: ...

    def revised(self, result: SubmissionResult) -> None:
        """A result already given, with figures that came after it (its speedups over
        torch.compile of the reference, timed as its problem closed): kept, not counted
        again."""


class Executor(Protocol):
    notes: list[str]  # what the run's reports say about the grading itself, once it ran

    def watch_store(self, presence: Presence) -> None:
        """The store's folder, shared with the process that writes it."""

    def environment(self) -> dict:
        """The machine the jobs run on, with ``problems`` (kbench.host.doctor) in it."""

    def run(self, jobs: list[Job], sink: Sink) -> None:
        """Grade every job; each result goes to ``sink`` as soon as it is known."""
