"""A grading run: the only writer of the store. It records the machine, reuses results of
unchanged files, hands the rest to an executor as jobs and stores what comes back, the
moment it comes back."""

from __future__ import annotations

from collections.abc import Callable

from kbench import __version__, environment
from kbench.discovery import Submission
from kbench.grading.executor import Executor, Job
from kbench.grading.options import Options
from kbench.results import Benchmark, SubmissionResult
from kbench.sandbox import remove_stale_logs
from kbench.store import Store
from kbench.task import Task

Progress = Callable[[SubmissionResult, int, int], None]  # a result, its place, how many


class _StoreSink:
    """Results and reference tables into the store, each passed on to ``report``."""

    def __init__(self, store: Store, run_id: int, report: Callable[[SubmissionResult], None]
                 ) -> None:
        self.store, self.run_id, self.report = store, run_id, report

    def reference(self, table: list[Benchmark], copy_gbps: float | None,
                  notes: list[str]) -> None:
        self.store.set_reference(self.run_id, table, copy_gbps, notes)

    def result(self, result: SubmissionResult) -> None:
        self.store.add_result(self.run_id, result)
        self.report(result)


def grade(task: Task, options: Options, executor: Executor, submissions: list[Submission],
          store: Store, run_id: int | None = None, force: bool = False,
          on_result: Progress = lambda r, i, n: None, say: Callable[[str], None] = print
          ) -> int:
    """Grade into ``store``: a new run, or the rest of ``run_id``. Each result is stored the
    moment it is known and passed to ``on_result`` with its place among the submissions this
    call grades. Returns the run's id. Raises StoreError if another kbench process is grading
    ``run_id``."""
    env = executor.environment()
    fingerprint = environment.fingerprint(env)
    if run_id is None:
        run_id = store.start_run(
            kbench_version=__version__, task=task.name, task_hash=task.digest,
            seed=options.seed, device=options.device.value, fingerprint=fingerprint,
            options=options.resumable(), environment=env)
    store.claim(run_id)
    store.set_problems(run_id, env["problems"])  # a resume says what it saw
    remove_stale_logs(options.out_dir / "logs")
    graded = store.graded_names(run_id)
    left = [sub for sub in submissions if sub.name not in graded]
    if graded:
        say(f"run {run_id} has {len(graded)} result(s) stored; grading the other {len(left)}")
    done = iter(range(1, len(left) + 1))
    sink = _StoreSink(store, run_id, lambda result: on_result(result, next(done), len(left)))
    todo = []
    for sub in left:
        earlier = None if force or not options.timed else store.reusable(
            sub.sha256, task.digest, __version__, fingerprint, options.timing.value)
        if earlier is None:
            todo.append(Job.make(task, sub, options))
            continue
        result = earlier[1]  # the same bytes, perhaps under another name
        result.name, result.path, result.reused_from_run = sub.name, str(sub.path), earlier[0]
        sink.result(result)
    if todo:
        executor.run(todo, sink)
    store.finish_run(run_id)
    return run_id
