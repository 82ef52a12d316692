"""The entry to grading: a run (kbench.grading.run) on this machine's device
(kbench.grading.executor.LocalExecutor). The stages live in kbench.grading; the map is
docs/architecture.md."""

from __future__ import annotations

from collections.abc import Callable

from kbench.grading import run
from kbench.grading.executor import LocalExecutor
from kbench.grading.options import Options
from kbench.store import Store


def grade(label: str, plan: run.Plan, options: Options, store: Store,
          run_id: int | None = None, force: bool = False,
          on_result: run.Progress = lambda r, i, n: None,
          say: Callable[[str], None] = lambda line: None) -> int:
    """Grade each problem's submissions locally into ``store`` as run ``label``; returns the
    run's id. Raises CaseError for a ``--case`` the plan does not have, StoreError for a run
    another process grades."""
    executor = LocalExecutor(options, say)
    executor.watch_store(store.presence)
    return run.grade(label, plan, options, executor, store, run_id, force, on_result, say)
