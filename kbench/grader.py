"""The entry to grading: a run (kbench.grading.running.driver) on this machine's device
(kbench.grading.running.local.LocalExecutor), on every GPU of the host
(kbench.grading.running.slots) or on a Ray cluster (kbench.grading.running.cluster). The stages
live in kbench.grading; the map is docs/architecture.md. Candidates given as source strings,
one at a time or many, from Python: ``Session`` (kbench.grading.running.session)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from kbench.grading.options import Options
from kbench.grading.running import driver, session
from kbench.grading.running.placement import Placement, executor_for
from kbench.grading.running.session import (  # noqa: F401 (the Python API, from here)
    BadSource,
    Limits,
    SessionError,
    UnknownProblem,
)
from kbench.results.store import Store


def grade(label: str, plan: driver.Plan, options: Options, store: Store,
          run_id: int | None = None, force: bool = False,
          on_result: driver.Progress = lambda r, i, n: None,
          say: Callable[[str], None] = lambda line: None,
          placement: Placement | None = None) -> int:
    """Grade each problem's submissions into ``store`` as run ``label``; returns the run's id.
    Raises CaseError for a ``--case`` the plan does not have, StoreError for a run another
    process grades, OptionsError for a placement that cannot be."""
    executor = executor_for(options, placement or Placement(), say, beside_builds=True)
    executor.watch_store(store.presence)
    return driver.grade(label, plan, options, executor, store, run_id, force, on_result, say)


def write_reports(store: Store, run_id: int, out_dir: Path) -> None:
    """A run's report folder (index.html, leaderboard.md, ...), as `kbench grade` writes it
    (its charts' plotting library imported only then)."""
    from kbench.reports import report_folder

    run = store.load_run(run_id)
    report_folder.write(run, out_dir, {s.name: store.history(s.name) for s in run.submissions})


class Session(session.Session):
    """A grading session (kbench.grading.running.session) whose reports are written to its
    output folder as it ends."""

    __init__ = functools.partialmethod(session.Session.__init__, write_reports=write_reports)
