"""Find submission files and the task each belongs to (read as paths, never imported)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kbench.task import available_tasks


@dataclass(frozen=True)
class Submission:
    name: str
    path: Path

    @cached_property
    def sha256(self) -> str:
        """The file's hash, read once: what results record and reuse is keyed on."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


class DiscoveryError(Exception):
    pass


def find_submissions(targets: list[str]) -> list[Submission]:
    """Files as given, folders as every ``*.py`` directly inside them, in name order."""
    files: list[Path] = []
    for target in targets:
        path = Path(target)
        if path.is_dir():
            files += sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
        elif path.is_file() and path.suffix == ".py":
            files.append(path)
        else:
            raise DiscoveryError(f"{target}: no such .py file or folder")
    if not files:
        raise DiscoveryError(f"no submissions (*.py) in {', '.join(targets)}")
    seen: dict[str, Path] = {}
    for f in files:
        if f.stem in seen and seen[f.stem].resolve() != f.resolve():
            raise DiscoveryError(f"two submissions are named {f.stem}: {seen[f.stem]} and {f}")
        seen[f.stem] = f
    return [Submission(name, path) for name, path in seen.items()]


def task_of(submissions: list[Submission]) -> str:
    """The one task named by the files' prefixes (``l2norm_v1.py`` -> ``l2norm``)."""
    known = available_tasks()
    tasks = set()
    for sub in submissions:
        prefix = sub.name.split("_", 1)[0]
        if prefix not in known:
            raise DiscoveryError(
                f"{sub.path}: cannot tell its task from the name; expected a prefix "
                f"{' or '.join(t + '_' for t in known) or '(no tasks found)'}, or pass --task")
        tasks.add(prefix)
    if len(tasks) > 1:
        raise DiscoveryError("these submissions belong to different tasks "
                             f"({', '.join(sorted(tasks))}); grade each task separately")
    return tasks.pop()
