"""Units of work for evaluation slots (kbench.grading.running.slots on one host,
kbench.grading.running.cluster on Ray): jobs cut into units that travel as plain data, graded where
they land by a LocalExecutor, and their events (problems, results, lines to say) carried back to the
one process that writes the store."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from kbench.grading.building.build import Built
from kbench.grading.building.hostsplit import OWN_CORES_NICE
from kbench.grading.context import Spare
from kbench.grading.jobs import Job, Sink
from kbench.grading.options import Options
from kbench.grading.running.local import LocalExecutor
from kbench.results.run_record import ProblemRun, SubmissionResult
from kbench.results.verdict import Status


@dataclass(frozen=True)
class Event:
    """What grading a unit hands back, one thing at a time: a problem's record, a result, a
    line to say, a job to grade again at the end (kbench.grading.building.pipeline says why),
    or the end of the unit. Crosses into the driver as ``to_dict``'s one key."""

    problem: ProblemRun | None = None
    result: SubmissionResult | None = None
    revised: SubmissionResult | None = None  # a result given before, with later figures
    say: str | None = None
    defer: Job | None = None
    done: bool = False

    def to_dict(self) -> dict:
        for name in ("problem", "result", "revised", "defer"):
            if (value := getattr(self, name)) is not None:
                return {name: value.to_dict()}
        return {"say": self.say} if self.say is not None else {"done": True}

    @classmethod
    def from_dict(cls, data: dict) -> Event:
        (name, value), = data.items()
        typed = {"problem": ProblemRun.from_dict, "result": SubmissionResult.from_dict,
                 "revised": SubmissionResult.from_dict, "defer": Job.from_dict
                 }.get(name, lambda v: v)
        return cls(**{name: typed(value)})


Emit = Callable[[Event], None]


@dataclass(frozen=True)
class Unit:
    """Submissions of one problem, graded together on one slot: the problem is screened and
    its reference timed there, and their speedups divide timings from that slot's device."""

    jobs: list[Job]
    environment_problem: str | None  # what kbench.host.doctor found on the driver's machine
    cores: int | None  # host cores the unit's builds share
    number: int = 0  # its place in the run's units (a retry keeps it)
    # The whole run's problem and submission files: watched here too (Watcher.for_run).
    run_tasks: tuple[str, ...] = ()
    run_files: tuple[str, ...] = ()
    # Its jobs' builds, by path: the driver's pipeline's (kbench.grading.running.slots) or what
    # a Ray node unpacked from build nodes (ray_tasks); a job missing is built where graded.
    built: dict[str, Built] | None = None
    final: bool = False  # graded after every build: nothing is deferred again
    # The last of their problems' submissions this slot is sent, as the driver knows now:
    # the problems close after them (drift check, processes ended); else they stay open for
    # the next unit (kbench.grading.running.slots), closed by ``finish`` at the latest.
    last: bool = True
    spare: tuple[int, ...] = ()  # cores for work ahead of its turn (kbench.grading.context.Spare)
    # A job of each problem the driver means to send this slot next: prepared meanwhile
    # (kbench.grading.running.local.LocalExecutor.prepare).
    soon: tuple[Job, ...] = ()

    def to_dict(self) -> dict:
        built = None if self.built is None else {p: b.to_dict() for p, b in self.built.items()}
        return {"jobs": [j.to_dict() for j in self.jobs], "number": self.number,
                "environment_problem": self.environment_problem, "cores": self.cores,
                "run_tasks": list(self.run_tasks), "run_files": list(self.run_files),
                "built": built, "final": self.final, "last": self.last,
                "spare": list(self.spare), "soon": [j.to_dict() for j in self.soon]}

    @classmethod
    def from_dict(cls, data: dict) -> Unit:
        built = data.get("built")
        return cls([Job.from_dict(j) for j in data["jobs"]], data["environment_problem"],
                   data["cores"], data["number"], tuple(data["run_tasks"]),
                   tuple(data["run_files"]),
                   None if built is None else {p: Built.from_dict(b) for p, b in built.items()},
                   data.get("final", False), data.get("last", True),
                   tuple(data.get("spare", ())),
                   tuple(Job.from_dict(j) for j in data.get("soon", ())))

    def rest(self, jobs: list[Job]) -> Unit:
        """The same unit with only ``jobs`` left, to grade again."""
        return replace(self, jobs=jobs)

    def options(self) -> Options:
        return replace(self.jobs[0].options, cores=self.cores)


def split(jobs: list[Job], slots: int, environment_problem: str | None,
          cores: int | None) -> list[Unit]:
    """Whole problems where that keeps ``slots`` evenly loaded; else a problem's submissions
    in pieces of at most one slot's share of the run, and in at least as many pieces as there
    are slots per problem (every piece pays for screening and timing the reference once, so
    pieces stay as large as that allows). Largest first: a long unit started last would leave
    the other slots idle while it runs."""
    groups: dict[tuple[str, str], list[Job]] = {}
    for job in jobs:
        groups.setdefault((job.task, job.problem), []).append(job)
    share = math.ceil(len(jobs) / max(1, slots))
    least = max(1, math.ceil(slots / max(1, len(groups))))
    pieces: list[list[Job]] = []
    for group in groups.values():
        count = min(len(group), max(least, math.ceil(len(group) / share)))
        size = math.ceil(len(group) / count)
        pieces += [group[i:i + size] for i in range(0, len(group), size)]
    pieces.sort(key=len, reverse=True)
    tasks = tuple(dict.fromkeys(job.task for job in jobs))
    files = tuple(job.path for job in jobs)
    return [Unit(piece, environment_problem, cores, k, tasks, files)
            for k, piece in enumerate(pieces)]


class EventSink:
    """A Sink that turns what a LocalExecutor hands back into events."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit

    def problem(self, problem: ProblemRun) -> None:
        self.emit(Event(problem=problem))

    def result(self, result: SubmissionResult) -> None:
        self.emit(Event(result=result))

    def revised(self, result: SubmissionResult) -> None:
        self.emit(Event(revised=result))


# The last options' executor: a slot process grades every unit under the same options (the
# toolchain found once); each Ray task has an output folder of its own, so only one is kept.
_executors: dict[str, LocalExecutor] = {}


def run(unit: Unit, emit: Emit) -> None:
    """Grade ``unit`` in this process, on the device it sees, every event to ``emit``."""
    options = unit.options()
    key = repr(options)
    if key not in _executors:
        _executors.clear()
        executor = LocalExecutor(options, pin=False)
        executor.note_unwatched = False  # the driver says it once for all slots
        executor.watch_out_dir()
        _executors[key] = executor
    executor = _executors[key]
    executor.say = lambda line: emit(Event(say=line))  # this unit's emit (a Ray task has its own)
    executor.environment_problem = unit.environment_problem
    executor.spare = Spare(unit.spare, OWN_CORES_NICE) if unit.spare else None  # a split's
    executor.watcher.for_run(unit.run_tasks, unit.run_files)
    executor.prepare(list(unit.soon))
    executor.run(unit.jobs, EventSink(emit), unit.built,
                 None if unit.final else lambda job: emit(Event(defer=job)), close=unit.last)


def finish(emit: Emit) -> None:
    """Close every problem this process holds open (kbench.grading.running.local)."""
    for executor in _executors.values():
        executor.say = lambda line: emit(Event(say=line))
        executor.finish(EventSink(emit))


class Delivery:
    """Events into the sink, in the one process that writes the store. A problem graded in
    several places (slots, Ray units: each an ``owner``) is screened and its reference timed
    in each (each one's speedups divide its own reference's rounds); the store keeps one
    record of it: the first owner's reference table, with every owner's notes and a note
    saying so."""

    def __init__(self, sink: Sink, say: Callable[[str], None]) -> None:
        self.sink, self.say = sink, say
        self.records: dict[str, tuple[object, ProblemRun]] = {}  # name: (its owner, record)
        self.notes: dict[str, list[str]] = {}
        self.owners: dict[str, set[object]] = {}
        self.deferred: list[Job] = []  # to grade again once the builds are done

    def __call__(self, event: Event, where: str, owner: object) -> None:
        if event.defer is not None:
            self.deferred.append(event.defer)
        elif event.result is not None:
            self.sink.result(event.result)
        elif event.revised is not None:
            self.sink.revised(event.revised)
        elif event.problem is not None:
            self._problem(event.problem, owner)
        elif event.say is not None:
            self.say(f"[{where}] {event.say}")

    def _problem(self, problem: ProblemRun, owner: object) -> None:
        name = problem.name
        first, record = self.records.setdefault(name, (owner, problem))
        if first == owner:
            record = problem
            self.records[name] = (owner, record)
        owners = self.owners.setdefault(name, set())
        owners.add(owner)
        notes = self.notes.setdefault(name, [])
        notes += [n for n in problem.notes if n not in notes]
        split = [f"graded in {len(owners)} places, each timing the reference on its own "
                 "device: the table is the first's, and each submission's speedups divide "
                 "the reference rounds of its own"] if len(owners) > 1 else []
        self.sink.problem(replace(record, notes=notes + split))


def lost(jobs: list[Job], why: str) -> list[SubmissionResult]:
    """What the jobs whose slot was lost for good get: infrastructure_error, never a guess."""
    return [SubmissionResult(name=j.name, path=j.path, sha256=j.sha256,
                             status=Status.INFRASTRUCTURE_ERROR, problem=j.problem,
                             reason=f"not graded: {why}; `kbench grade --resume` grades it "
                                    "again") for j in jobs]
