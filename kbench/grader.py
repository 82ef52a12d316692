"""The entry to grading: a run (kbench.grading.run) on this machine's device
(kbench.grading.executor.LocalExecutor). The stages live in kbench.grading; the map is
docs/architecture.md."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable, Iterator

import psutil

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
    with host_memory_cap(options.device.value):
        return run.grade(label, plan, options, executor, store, run_id, force, on_result, say)


# The share of the machine's memory a CPU run's kbench process may map beyond what it has.
_HOST_SHARE = 0.75


@contextlib.contextmanager
def host_memory_cap(device: str) -> Iterator[None]:
    """On a CPU run the reference runs in this process. Its address space (and that of the
    workers it starts) is capped at what it maps now plus _HOST_SHARE of the machine's
    memory: a problem too large for the machine fails an allocation (a problem error, or
    out_of_memory) rather than the kernel's OOM killer ending kbench. Not on CUDA runs: the
    CUDA driver reserves far more address space than it uses."""
    if device != "cpu":
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + int(_HOST_SHARE * psutil.virtual_memory().total)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
