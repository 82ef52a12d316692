"""What a Ray node does for kbench.grading.running.cluster, with nothing shared but kbench
installed: the run's files arrive as a bundle and are laid out under the node's own cache (its
KBENCH_CACHE_DIR, or the default), each task writes its logs in a folder of its own there and
hands them back with its answer, and every path in what it hands back is the driver's again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from kbench.grading.jobs import Job
from kbench.grading.running.units import Event
from kbench.host import paths


@dataclass(frozen=True)
class Bundle:
    """The run's submissions and problem files by their absolute paths on the driver."""

    files: dict[str, bytes]
    tasks: tuple[str, ...]
    submissions: tuple[str, ...]
    digest: str


def bundle(jobs: list[Job]) -> Bundle:
    """Every job's file and its problem's files (the task, the YAML or problem file beside it,
    a problem file its YAML names), as they are now."""
    tasks = tuple(dict.fromkeys(j.task for j in jobs))
    subs = tuple(dict.fromkeys(j.path for j in jobs))
    files: dict[str, bytes] = {}
    for path in [*subs, *(f for t in tasks for f in _problem_files(Path(t)))]:
        try:
            files[path] = Path(path).read_bytes()
        except OSError:
            continue  # a problem file that is not there: the node reports it as the driver would
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return Bundle(files, tasks, subs, digest.hexdigest())


def absolute(job: Job) -> Job:
    """The job with absolute paths: what it is known by on every node."""
    return replace(job, task=str(Path(job.task).resolve()), path=str(Path(job.path).resolve()))


@dataclass(frozen=True)
class Where:
    """The node a task ran on, and the build cache it used there."""

    node: str  # Ray's node id
    host: str
    cache: str


class Node:
    """This node's copy of a run's files, and a folder of this task's own for its output."""

    def __init__(self, run: Bundle) -> None:
        self.cache = paths.default_cache_dir().resolve()
        self.root = self.cache / "ray" / run.digest[:16]
        self.files = self.root / "files"
        for path, data in run.files.items():
            _write(self.files / Path(path).relative_to("/"), data)
        self.out = self.root / "out" / uuid.uuid4().hex
        self.run = run

    def path(self, driver_path: str) -> str:
        return str(self.files / Path(driver_path).relative_to("/"))

    def job(self, job: Job) -> Job:
        """``job`` as this node grades it: its files here, output and cache this node's."""
        options = replace(job.options, out_dir=self.out, cache_dir=self.cache)
        return replace(job, task=self.path(job.task), path=self.path(job.path), options=options)

    def run_files(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The run's problems and submissions here (watched while any submission's code runs)."""
        return tuple(map(self.path, self.run.tasks)), tuple(map(self.path, self.run.submissions))

    def where(self) -> Where:
        import ray

        return Where(ray.get_runtime_context().get_node_id(), socket.gethostname(),
                     str(self.cache))

    def back(self, events: Iterable[Event], driver_out: str) -> list[Event]:
        """``events`` with this node's paths put back to the driver's."""
        text = json.dumps([e.to_dict() for e in events])
        for here, there in ((self.out, driver_out), (self.files, "")):
            text = text.replace(json.dumps(str(here))[1:-1], json.dumps(there)[1:-1])
        return [Event.from_dict(e) for e in json.loads(text)]

    def logs(self) -> dict[str, bytes]:
        """What this task wrote to its output folder, by path inside it; the folder goes."""
        found = {str(p.relative_to(self.out)): p.read_bytes()
                 for p in self.out.rglob("*")
                 if p.is_file() and not p.name.startswith(".kbench")}
        shutil.rmtree(self.out, ignore_errors=True)
        return found


def write_logs(logs: dict[str, bytes], out_dir: Path) -> None:
    """A task's logs into the driver's output folder, where a local run would have them."""
    for name, data in logs.items():
        path = out_dir / name
        if out_dir.resolve() in path.resolve().parents:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _write(path: Path, data: bytes) -> None:
    """Atomically, unless it is there already (tasks of one run on one node share the copy)."""
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _problem_files(task: Path) -> list[str]:
    """The task file, the YAML or problem file of the same stem beside it, and a problem
    file a YAML names (relative to it)."""
    from kbench.problems.task import TaskError
    from kbench.problems.task_yaml import read_yaml

    task = task.resolve()
    files = [task, task.with_suffix(".yaml"), task.with_suffix(".py")]
    try:
        raw = read_yaml(files[1]) if files[1].is_file() else \
            read_yaml(task) if task.suffix in (".yaml", ".yml") else None
    except TaskError:
        raw = None
    reference = raw.get("reference") if isinstance(raw, dict) else None
    if isinstance(reference, str) and reference.endswith(".py"):
        files.append((task.parent / reference).resolve())
    return [str(f) for f in dict.fromkeys(files)]
