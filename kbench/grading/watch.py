"""Watching kbench's own files while a submission's code runs (kbench.guard): what it changed
is put right and its verdict becomes flagged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kbench import paths
from kbench.grading.context import Context
from kbench.guard import Guard, Presence
from kbench.verdict import Status, Verdict


def tampered(when: str, lines: list[str]) -> Verdict:
    return Verdict(Status.FLAGGED, f"{when}, wrote to files kbench owns (put right since): "
                   + "; ".join(lines)[:1000])


class Watcher:
    def __init__(self, ctx: Context) -> None:
        opts = ctx.options
        # kbench's own code (every new worker imports it) but not the bundled submissions:
        # those of a run are watched one by one.
        code = tuple(p for p in paths.PACKAGE_DIR.iterdir()
                     if p.name not in ("submissions", "__pycache__"))
        cache = opts.cache_dir / "extensions"
        self.guard = Guard(restorable=(opts.out_dir, ctx.task.path,
                                       Path(ctx.reference.__file__), *code),
                           cache=(cache,), shared=(opts.out_dir, cache))
        self.presences = [Presence(opts.cache_dir)]  # and the store's (see add_presence)
        self.unwatched = 0  # windows whose writes to the shared folders went unchecked

    def add_presence(self, presence: Presence) -> None:
        self.presences.append(presence)

    def watch(self, files: list[Path], ignore: list[Path]) -> Callable[[], list[str]]:
        """Start watching kbench's files, and ``files``, while submissions' code runs; call
        the result once it has ended: what they changed, put right since. The output folder
        and the build cache count only if no other kbench process used them at the start or
        at the end (their writes there cannot be told from a submission's)."""
        guard = Guard(self.guard.restorable + tuple(files), self.guard.cache, self.guard.shared)
        alone = all(p.alone() for p in self.presences)
        before = guard.snapshot(ignore, alone)

        def changed() -> list[str]:
            shared = alone and all(p.alone() for p in self.presences)
            self.unwatched += not shared
            return guard.repair(before, ignore, shared)
        return changed
