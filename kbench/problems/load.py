"""A task by name or path: a KernelBench problem file (defaults.py), a YAML
(task_yaml.py), or a YAML over a problem file, loaded once per process while its file is
unchanged (a problem's analysis takes time)."""

from __future__ import annotations

from pathlib import Path

from kbench.problems import task_yaml
from kbench.problems.defaults import from_problem
from kbench.problems.task import Task, find_task

_loaded: dict[tuple, Task] = {}


def load_task(name_or_path: str, name: str | None = None) -> Task:
    """A problem file beside a YAML of the same stem is graded by the YAML. ``name`` renames
    the task (a problem in a set: level1/19_ReLU)."""
    path = find_task(name_or_path)
    if path.suffix == ".py" and path.with_suffix(".yaml").is_file():
        path = path.with_suffix(".yaml")
    key = (path.resolve(), name, path.stat().st_mtime_ns)
    if key not in _loaded:
        _loaded[key] = _load(path, name)
    return _loaded[key]


def _load(path: Path, name: str | None) -> Task:
    if path.suffix == ".py":
        task = from_problem(path)
    else:
        raw = task_yaml.read_yaml(path)
        file = task_yaml.problem_file(path, raw)
        task = from_problem(file, raw, path) if file is not None else \
            task_yaml.parse(path, raw)
    return task.renamed(name) if name else task
