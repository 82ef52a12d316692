"""Watching kbench's own files while a submission's code runs (kbench.guard): what it changed
is put right and its verdict becomes flagged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kbench import paths
from kbench.grading.context import Context
from kbench.grading.options import Options
from kbench.guard import Guard, Presence
from kbench.verdict import Status, Verdict


def tampered(when: str, lines: list[str]) -> Verdict:
    return Verdict(Status.FLAGGED, f"{when}, wrote to files kbench owns (put right since): "
                   + "; ".join(lines)[:1000])


class Watcher:
    """kbench's files for a run, and the task's (see ``for_task``)."""

    def __init__(self, options: Options) -> None:
        # kbench's own code (every new worker imports it) but not the bundled submissions:
        # those of a run are watched one by one.
        code = tuple(p for p in paths.PACKAGE_DIR.iterdir()
                     if p.name not in ("submissions", "__pycache__"))
        cache = options.cache_dir / "extensions"
        self.guard = Guard(restorable=(options.out_dir, *code), cache=(cache,),
                           shared=(options.out_dir, cache))
        self.presences = [Presence(options.cache_dir)]  # and the store's (see add_presence)
        self.task_files: tuple[Path, ...] = ()
        self.unwatched = 0  # windows whose writes to the shared folders went unchecked

    def add_presence(self, presence: Presence) -> None:
        self.presences.append(presence)

    def for_task(self, ctx: Context) -> None:
        """Watch the task being graded too: its file and its reference."""
        self.task_files = tuple(dict.fromkeys((ctx.task.path, ctx.task.reference_path)))

    def watch(self, files: list[Path], ignore: list[Path]) -> Callable[[], list[str]]:
        """Start watching kbench's files, and ``files``, while submissions' code runs; call
        the result once it has ended: what they changed, put right since. The output folder
        and the build cache count only if no other kbench process used them at the start or
        at the end (their writes there cannot be told from a submission's)."""
        guard = Guard(self.guard.restorable + self.task_files + tuple(files), self.guard.cache,
                      self.guard.shared)
        alone = all(p.alone() for p in self.presences)
        before = guard.snapshot(ignore, alone)

        def changed() -> list[str]:
            shared = alone and all(p.alone() for p in self.presences)
            self.unwatched += not shared
            return guard.repair(before, ignore, shared)
        return changed
