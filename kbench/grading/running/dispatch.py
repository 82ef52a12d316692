"""Which slot grades what next (kbench.grading.running.slots): the run's jobs handed out as
their builds come out of the pipeline, a problem's to the slot that holds it open, and each
slot told which problems come to it next, so that it prepares them while it grades."""

from __future__ import annotations

import collections
import threading
from dataclasses import replace

from kbench.grading.building.pipeline import Pipeline
from kbench.grading.jobs import Job
from kbench.grading.running import units

_STEAL = 2  # ready jobs of a problem another slot holds before an idle slot takes half
_SOON = 2  # problems a slot is told it grades next, to prepare meanwhile (Unit.soon)


class Dispatch:
    """The run's jobs, handed to slots as their builds come out of the pipeline (suspects left
    out: graded at the end). A slot is given the ready jobs of one problem at a time: of a
    problem it holds open first (screened there, its reference timed there), else of one it
    was told comes next (prepared there), else of one no slot holds or was told of, else of
    one no slot holds, else, where a problem held elsewhere has a backlog, half of it (this
    slot then screens and times the reference too: each speedup divides its own GPU's). A
    unit that comes back (its slot was lost) goes out first, as it was."""

    def __init__(self, jobs: list[Job], pipeline: Pipeline | None,
                 template: units.Unit | None) -> None:
        self.pipeline, self.template = pipeline, template
        self.cond = pipeline.cond if pipeline is not None else threading.Condition()
        self.pending = list(jobs)
        self.queue: list[tuple[units.Unit, int]] = []
        self.held: dict[str, set[tuple[str, str]]] = {}  # by slot: the problems it holds
        self.told: dict[str, set[tuple[str, str]]] = {}  # by slot: those it was told of next
        self.count = 0  # units made so far (each one's number)

    @classmethod
    def given(cls, plan: list[units.Unit]) -> Dispatch:
        """Units already made and built (the last pass, alone)."""
        work = cls([], None, None)
        work.queue = [(unit, 0) for unit in plan]
        return work

    def get(self, slot: str) -> tuple[units.Unit, int] | None:
        """The next unit for ``slot``, waiting for one; None once none is left."""
        with self.cond:
            while True:
                if self.queue:
                    return self.queue.pop(0)
                if not self.pending:
                    return None
                if (unit := self._next(slot)) is not None:
                    return unit, 0
                self.cond.wait()

    def _next(self, slot: str) -> units.Unit | None:
        released = self.pipeline.built()
        out = [j for j in self.pending if self.pipeline.ready(self.pipeline.siblings(j))]
        self.pending = [j for j in self.pending if j not in out or j.path in released]
        chosen = self._choose(slot, [j for j in out if j.path in released])
        if chosen is None:
            return None
        problem, steal = chosen
        jobs = [j for j in out if key_of(j) == problem and j.path in released]
        jobs = jobs[:max(1, len(jobs) // 2)] if steal else jobs
        self.pending = [j for j in self.pending if j not in jobs]
        self.cond.notify_all()  # a slot waiting for what is left may be done
        last = not any(key_of(j) == problem for j in self.pending)
        held = self.held.setdefault(slot, set())
        (held.discard if last else held.add)(problem)
        for told in self.told.values():
            told.discard(problem)
        self.count += 1
        return replace(self.template, jobs=jobs, number=self.count - 1, last=last,
                       built={j.path: released[j.path] for j in jobs if released[j.path]},
                       soon=self._soon(slot, released))

    def _soon(self, slot: str, released: dict) -> tuple[Job, ...]:
        """A job of each of the next problems no slot holds or was told of (those with a build
        out first), told to ``slot``, which prepares them while it grades: _SOON told and not
        yet taken at most (each one's torch.compile process lives meanwhile)."""
        taken = set().union(*self.held.values(), *self.told.values())
        told = self.told.setdefault(slot, set())
        soon: dict[tuple[str, str], Job] = {}
        for job in sorted(self.pending, key=lambda j: j.path not in released):
            if len(told) + len(soon) < _SOON and key_of(job) not in taken:
                soon.setdefault(key_of(job), job)
        told.update(soon)
        return tuple(soon.values())

    def _choose(self, slot: str, ready: list[Job]) -> tuple[tuple[str, str], bool] | None:
        """The problem whose ready jobs go to ``slot``, and whether they are taken from
        another slot's backlog."""
        mine = self.held.get(slot, set())
        theirs = set().union(*(h for s, h in self.held.items() if s != slot))
        told = set().union(*(t for s, t in self.told.items() if s != slot))
        for among in (mine, self.told.get(slot, set())):
            for job in ready:
                if key_of(job) in among:
                    return key_of(job), False
        for free in (lambda key: key not in theirs and key not in told,
                     lambda key: key not in theirs):
            for job in ready:
                if free(key_of(job)):
                    return key_of(job), False
        backlog = collections.Counter(key_of(j) for j in ready).most_common(1)
        if backlog and backlog[0][1] >= _STEAL:
            return backlog[0][0], True
        return None

    def forget(self, slot: str) -> None:
        """``slot``'s process is new: it holds nothing open."""
        with self.cond:
            self.held.pop(slot, None)
            self.told.pop(slot, None)

    def put(self, unit: units.Unit, tries: int) -> None:
        with self.cond:
            self.queue.append((unit, tries))
            self.cond.notify_all()

    def left(self) -> list[tuple[units.Unit, int]]:
        """What no slot took (every slot's process failed to start), as units."""
        with self.cond:
            left, self.queue = self.queue, []
            if self.pending and self.template is not None:
                left.append((replace(self.template, jobs=self.pending), 0))
                self.pending = []
            return left


def key_of(job: Job) -> tuple[str, str]:
    return job.task, job.problem
