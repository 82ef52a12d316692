"""A grading run: the only writer of the store. It records the machine, reuses results of
unchanged files, hands the rest to an executor as jobs and stores what comes back, the
moment it comes back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kbench import __version__
from kbench.grading.jobs import Executor, Job
from kbench.grading.options import Options
from kbench.host import environment, interrupt, proctree
from kbench.problems.discovery import Submission
from kbench.problems.task import Task
from kbench.results.run_record import ProblemRun, SubmissionResult
from kbench.results.store import Store
from kbench.sandbox import remove_stale_logs

Progress = Callable[[SubmissionResult, int, int], None]  # a result, its place, how many


@dataclass
class Entry:
    """A problem and the submissions graded against it; ``task`` is None where the problem
    could not be loaded (the executor then reports why, and its submissions get task_error)."""

    name: str
    path: Path
    task: Task | None
    submissions: list[Submission]


Plan = list[Entry]


class StoreSink:
    """Results and problems into the store, each result passed on to ``report``."""

    def __init__(self, store: Store, run_id: int, report: Callable[[SubmissionResult], None]
                 ) -> None:
        self.store, self.run_id, self.report = store, run_id, report

    def problem(self, problem: ProblemRun) -> None:
        self.store.set_problem(self.run_id, problem)

    def result(self, result: SubmissionResult) -> None:
        self.store.add_result(self.run_id, result)
        self.report(result)

    def revised(self, result: SubmissionResult) -> None:
        self.store.add_result(self.run_id, result)


def plan_digest(plan: Plan) -> str:
    """What a resumed run must still grade against: every task's digest, by name."""
    return hashlib.sha256(json.dumps(sorted(
        (e.name, e.task.digest if e.task else f"unloadable {e.path}") for e in plan)).encode()
    ).hexdigest()


def grade(label: str, plan: Plan, options: Options, executor: Executor, store: Store,
          run_id: int | None = None, force: bool = False,
          on_result: Progress = lambda r, i, n: None, say: Callable[[str], None] = print
          ) -> int:
    """Grade into ``store``: a new run named ``label``, or the rest of ``run_id``. Each
    result is stored the moment it is known and passed to ``on_result`` with its place among
    the submissions this call grades. Returns the run's id. Raises StoreError if another
    kbench process is grading ``run_id``, and Interrupted (its ``run_id`` set) when kbench is
    told to stop: the run stays unfinished, for ``--resume``."""
    run_id, fingerprint = begin(label, plan_digest(plan), options, executor, store, run_id, say)
    try:
        graded = store.graded_names(run_id)
        left = [(e, sub) for e in plan for sub in e.submissions if sub.name not in graded]
        if graded:
            say(f"run {run_id} has {len(graded)} result(s) stored; "
                f"grading the other {len(left)}")
        done = iter(range(1, len(left) + 1))
        sink = StoreSink(store, run_id,
                         lambda result: on_result(result, next(done), len(left)))
        todo = reuse(left, options, store, fingerprint, force, sink)
        if todo:
            executor.run(todo, sink)
        interrupt.check()
    except interrupt.Interrupted as stopped:
        stopped.run_id = run_id
        raise
    finally:
        store.add_notes(run_id, executor.notes)
    store.finish_run(run_id)
    return run_id


def begin(label: str, digest: str, options: Options, executor: Executor, store: Store,
          run_id: int | None = None, say: Callable[[str], None] = print) -> tuple[int, str]:
    """A run started (``label``, its problems' ``digest``) or ``run_id`` taken up again, and
    claimed by this process: its id and the machine's fingerprint."""
    if swept := proctree.sweep_abandoned():
        say(f"killed {len(swept)} process(es) that kbench runs since ended had left running")
    env = executor.environment()
    fingerprint = environment.fingerprint(env)
    if run_id is None:
        run_id = store.start_run(
            kbench_version=__version__, task=label, task_hash=digest, seed=options.seed,
            device=options.device.value, fingerprint=fingerprint,
            options=options.resumable(), environment=env)
    try:
        store.claim(run_id)
        store.set_problems(run_id, env["problems"])  # a resume says what it saw
        remove_stale_logs(options.out_dir / "logs")
    except interrupt.Interrupted as stopped:
        stopped.run_id = run_id
        raise
    return run_id, fingerprint


def reuse(left: list[tuple[Entry, Submission]], options: Options, store: Store,
          fingerprint: str, force: bool, sink: StoreSink) -> list[Job]:
    """Each stored result of an unchanged file under the same conditions into ``sink``; the
    jobs of the others, to grade."""
    todo = []
    reused: set[str] = set()
    for entry, sub in left:
        earlier = None if force or not options.timed or entry.task is None else \
            store.reusable(sub.sha256, entry.task.digest, __version__, fingerprint,
                           options.reuse_key(), Options.unrecorded())
        if earlier is None:
            todo.append(Job.make(entry.path, entry.name, sub, options))
            continue
        if entry.name not in reused:  # the problem's record comes with its results
            reused.add(entry.name)
            copied = store.problem(earlier[0], entry.name)
            if copied is not None:
                sink.problem(copied)
        result = earlier[1]  # the same bytes, perhaps under another name
        result.name, result.path, result.reused_from_run = sub.name, str(sub.path), earlier[0]
        result.problem = entry.name
        sink.result(result)
    return todo
