"""Watching kbench's own files while a submission's code runs (guard.py): what it changed
is put right and its verdict becomes flagged."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from kbench.grading.building.guard import BuildMark, Guard, Seen
from kbench.grading.context import Context
from kbench.grading.options import Options
from kbench.host import paths
from kbench.problems.task import TaskError
from kbench.problems.task_yaml import read_yaml
from kbench.results.presence import Presence
from kbench.results.store import FILENAME, OPENING_LOCK
from kbench.results.verdict import Status, Verdict


def tampered(when: str, lines: list[str]) -> Verdict:
    return Verdict(Status.FLAGGED, f"{when}, wrote to files kbench owns (put right since): "
                   + "; ".join(lines)[:1000])


@dataclass(frozen=True)
class Finding:
    """What a window found changed (put right since). ``builds_beside``: a build pipeline ran
    other submissions' code meanwhile, so the change cannot be pinned on this window's own."""

    lines: list[str]
    builds_beside: bool = False


class Watcher:
    """kbench's files for a run, and the task's (see ``for_task``)."""

    def __init__(self, options: Options) -> None:
        # kbench's own code (every new worker imports it) but not the bundled submissions:
        # those of a run are watched one by one.
        code = tuple(p for p in paths.PACKAGE_DIR.iterdir()
                     if p.name not in ("submissions", "__pycache__"))
        cache = options.cache_dir / "extensions"
        headers = options.cache_dir / "pch"  # kbench.host.pch: written before builds start
        self.guard = Guard(restorable=(options.out_dir, *code), cache=(cache, headers),
                           shared=(options.out_dir, cache, headers))
        self.presences = [Presence(options.cache_dir)]  # and the store's (see add_presence)
        self.run_files: dict[Path, None] = {}  # the run's problems and submissions (for_run)
        self.task_files: tuple[Path, ...] = ()  # the problem being graded (for_task)
        self.known: dict[Path, Seen] = {}  # the last snapshots: kept bytes read once
        self.builds = BuildMark(options.cache_dir)
        self.store_files = (options.out_dir / FILENAME, options.out_dir / OPENING_LOCK)
        self.unwatched = 0  # windows whose writes to the shared folders went unchecked
        self.sharers: dict[Path, set[int]] = {}  # shared folder -> the other processes seen

    def add_presence(self, presence: Presence) -> None:
        self.presences.append(presence)

    def for_run(self, tasks: Iterable[str], submissions: Iterable[str]) -> None:
        """Watch every problem and submission of the run whenever any submission's code runs:
        one could otherwise rewrite a problem graded after it (or plant a YAML beside it,
        which would take over its settings), or another submission. Like the output folder,
        these count only while this process is alone: another slot of the run restoring what
        its submission wrote would read here as this one's doing."""
        for task in dict.fromkeys(map(Path, tasks)):
            self.run_files.update(dict.fromkeys(_problem_files(task)))
        self.run_files.update(dict.fromkeys(Path(s).resolve() for s in submissions))

    def for_task(self, ctx: Context) -> None:
        """Watch the task being graded always: its file and its reference."""
        self.task_files = tuple(dict.fromkeys((ctx.task.path.resolve(), ctx.task.reference_path)))

    def watch(self, files: list[Path], ignore: list[Path], builds: bool = False
              ) -> Callable[[], Finding]:
        """Start watching kbench's files, the task's and ``files``, while submissions' code
        runs; call the result once it has ended: what they changed, put right since. The
        output folder, the build cache and the run's other files count only if no other
        kbench process used them at the start or at the end (their writes there cannot be
        told from a submission's), and the cache only while no build pipeline is at work
        (kbench.grading.building.guard.BuildMark).
        ``builds``: the pipeline's own window, which never compares the store its run writes
        meanwhile; ``changed(more)`` leaves out ``more`` too (the folders builds have filled
        by then)."""
        own = self.task_files + tuple(Path(f).resolve() for f in files)
        others = tuple(f for f in self.run_files if f not in own)
        guard = Guard(self.guard.restorable + own + others, self.guard.cache,
                      self.guard.shared + others)
        if builds:
            ignore = [*ignore, *self.store_files]
        beside = not builds and self.builds.busy()
        repairs = self.builds.repairs()
        alone = all(p.alone() for p in self.presences)
        skip = [*ignore, *(self.guard.cache if beside else ())]  # builds fill the cache
        before = guard.snapshot(skip, alone, self.known)
        self.known.update(before)

        def changed(more: Iterable[Path] = ()) -> Finding:
            """Beside a build pipeline, what changed is left for the pipeline to put right
            (it restores the run's first state; this window's may hold a build's doing), and
            a change it put right meanwhile counts too."""
            shared = alone and all(p.alone() for p in self.presences)
            self.unwatched += not shared
            if not shared:
                self._note_sharers()
            lines = guard.repair(before, [*skip, *more], shared, undo=not beside)
            if beside and self.builds.repairs() != repairs:
                lines.append("kbench's files changed meanwhile (the build pipeline put them "
                             "right)")
            return Finding(lines, beside)
        return changed

    def _note_sharers(self) -> None:
        for presence in self.presences:
            if pids := presence.others():
                self.sharers.setdefault(presence.folder, set()).update(pids)

    def unwatched_note(self) -> str:
        """How often shared folders went unchecked, and which folders and processes made it
        so ("" where none did)."""
        if not self.unwatched:
            return ""
        who = "; ".join(f"{folder}: {', '.join(_process(pid) for pid in sorted(pids))}"
                        for folder, pids in self.sharers.items())
        return (f"other kbench processes used this run's folders in {self.unwatched} of its "
                f"watch windows ({who or 'they had ended by the time they were looked up'}); "
                "writes there by the submissions then running could not be told from theirs "
                "and went unchecked")


def _process(pid: int) -> str:
    """A process as a user can find it: its id and command line."""
    try:
        line = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"pid {pid} (ended)"
    return f"pid {pid} ({line[:120]})"


def _problem_files(task: Path) -> list[Path]:
    """A problem's files: the one named, the YAML or problem file of the same stem beside it
    (found or not: a new one counts), and the problem file a YAML names."""
    task = task.resolve()
    files = [task, task.with_suffix(".yaml"), task.with_suffix(".py")]
    try:
        raw = read_yaml(files[1]) if files[1].is_file() else None
    except TaskError:
        raw = None  # reported when the problem is loaded
    reference = raw.get("reference") if isinstance(raw, dict) else None
    if isinstance(reference, str) and reference.endswith(".py"):
        files.append((task.parent / reference).resolve())
    return files
