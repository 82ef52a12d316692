"""Find submission files, the problems they are graded against, and which goes with which
(files are read as paths, never imported).

Problems: a task name or file (``--task``), a folder of problem files named by their path in
it (``level1/19_ReLU``), or, without ``--task``, the bundled tasks/. A submission goes with a
problem by, in this order:

- KernelBench's generation layout: ``level_1_problem_19_sample_0_kernel.py`` -> the problem
  numbered 19 in the problem set's ``level1`` folder;
- a folder named after the problem: ``19_ReLU/any.py`` or ``level1/19_ReLU/any.py``;
- a prefix of its name: ``l2norm_v3.py`` -> l2norm (the longest problem name that fits);
- the one problem, when ``--task`` names just one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kbench.problems.task import available_tasks, find_task


@dataclass(frozen=True)
class Submission:
    name: str
    path: Path

    @cached_property
    def sha256(self) -> str:
        """The file's hash, read once: what results record and reuse is keyed on."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    @property
    def log_name(self) -> str:
        """The name as part of a log file's name."""
        return self.name.replace("/", "__")


class DiscoveryError(Exception):
    pass


@dataclass(frozen=True)
class Problem:
    name: str  # as reports show it: l2norm, level1/19_ReLU
    path: Path  # the task file (a YAML or the problem file)


_KERNELBENCH = re.compile(r"level_?(\d+)_problem_(\d+)_sample_(\d+)")
_SKIP = ("_", ".")


def find_files(targets: list[str]) -> list[Path]:
    """Files as given, folders as every ``*.py`` below them, in path order."""
    files: list[Path] = []
    for target in targets:
        path = Path(target)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*.py") if _visible(p.relative_to(path)))
        elif path.is_file() and path.suffix == ".py":
            files.append(path)
        else:
            raise DiscoveryError(f"{target}: no such .py file or folder")
    if not files:
        raise DiscoveryError(f"no submissions (*.py) in {', '.join(targets)}")
    return files


def _visible(relative: Path) -> bool:
    return not any(part.startswith(_SKIP) or part == "__pycache__" for part in relative.parts)


def find_problems(task: str | None) -> tuple[str, list[Problem]]:
    """The problem set's name and its problems: one task (by name or file), every problem
    file and task YAML below a folder, or the bundled tasks/."""
    if task is None:
        return "tasks", [Problem(n, find_task(n)) for n in available_tasks()]
    folder = Path(task)
    if not folder.is_dir():
        path = find_task(task)
        return path.stem, [Problem(path.stem, path)]
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.suffix in (".py", ".yaml", ".yml") and _visible(relative):
            name = relative.with_suffix("").as_posix()
            if path.suffix == ".py" or name not in found:  # a YAML beside its file: load_task
                found[name] = path
    if not found:
        raise DiscoveryError(f"{folder}: no problem files (*.py) or task YAMLs in it")
    return folder.resolve().name, [Problem(n, p) for n, p in found.items()]


def assign(files: list[Path], problems: list[Problem], roots: list[str], named: bool = False
           ) -> tuple[dict[Problem, list[Submission]], list[str]]:
    """Each file's problem and its name in the run; and a line for each file that goes with
    no problem. ``named``: --task named the problems (one of them takes any file). Raises
    DiscoveryError for two submissions of one name."""
    out: dict[Problem, list[Submission]] = {}
    unmatched: list[str] = []
    seen: dict[str, Path] = {}
    for file in files:
        match = _match(file, problems, roots, named)
        if match is None:
            unmatched.append(f"{file}: cannot tell its task from the name; expected a name "
                             f"such as {_example(problems)}_v1.py, a folder named after a "
                             "problem, KernelBench's level_L_problem_P_sample_S_kernel.py, "
                             "or pass --task")
            continue
        problem, name = match
        if name in seen and seen[name].resolve() != file.resolve():
            raise DiscoveryError(f"two submissions are named {name}: {seen[name]} and {file}")
        if name not in seen:
            seen[name] = file
            out.setdefault(problem, []).append(Submission(name, file))
    return out, unmatched


def _example(problems: list[Problem]) -> str:
    return problems[0].name.rsplit("/", 1)[-1] if problems else "TASK"


def _match(file: Path, problems: list[Problem], roots: list[str], named: bool
           ) -> tuple[Problem, str] | None:
    stem = file.stem
    if m := _KERNELBENCH.search(stem):
        level, number = m.group(1), m.group(2)
        for p in problems:
            folder, _, base = p.name.rpartition("/")
            folder = folder.rsplit("/", 1)[-1] or p.path.parent.name
            if folder in (f"level{level}", f"level_{level}") and base.split("_", 1)[0] == number:
                return p, stem
    relative = _relative(file, roots)
    for p in sorted(problems, key=lambda p: -len(p.name)):
        base = p.name.rsplit("/", 1)[-1]
        parent = relative.parent.as_posix()
        if parent == p.name or parent.endswith("/" + p.name) or relative.parent.name == base:
            return p, f"{base}/{stem}"
    for p in sorted(problems, key=lambda p: -len(p.name.rsplit("/", 1)[-1])):
        base = p.name.rsplit("/", 1)[-1]
        if stem.startswith(base + "_"):
            return p, stem
    if named and len(problems) == 1:
        return problems[0], stem
    return None


def _relative(file: Path, roots: list[str]) -> Path:
    """The file's path under the folder it was found in; one directly in that folder keeps the
    folder's name (``kbench grade subs/19_ReLU`` is the folder rule too)."""
    for root in roots:
        if Path(root).is_dir():
            folder = Path(root).resolve()
            try:
                relative = file.resolve().relative_to(folder)
            except ValueError:
                continue
            return folder.name / relative if relative.parent == Path(".") else relative
    return file.resolve()
