"""Files the trusted side owns, watched while a submission's code runs.

A submission runs as the same user as kbench, so it can write what kbench wrote: the results
store and reports, the build cache, the task and reference, kbench's own code (which every new
worker imports). Before its process starts, ``Guard.snapshot`` records every watched file's
identity (inode, size, modification and change times: the change time moves on any write and
cannot be set back by an unprivileged process) and keeps the bytes of the small ones; after the
process has ended, ``Guard.repair`` compares. Nothing else writes those files meanwhile, so any
difference is the submission's doing: changed or deleted files are restored from the kept
bytes, new files are removed, and a changed build folder in the cache is deleted (it is rebuilt
when next needed). This detects and repairs; it does not prevent (see docs/security.md).

Other kbench processes may legitimately write the output folder and the build cache at the same
time (several graders on one folder, ``kbench report``): each holds a ``Presence`` there, and
those ``shared`` folders are compared only when this process was alone in them at the snapshot
and at the repair. SQLite's own side files (``-wal``, ``-shm``) are not watched: any reader
writes them, and the store empties its write-ahead log after every commit (kbench.results.store).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kbench.results.presence import LOCK_NAME

_KEEP_BYTES = 64 << 20  # restorable files are kept in memory up to this size each
_VOLATILE = ("-wal", "-shm")  # SQLite's side files in WAL mode: readers write them too
BUILDING_NAME = ".kbench-building"


class BuildMark:
    """Whether a kbench build pipeline (kbench.grading.building.pipeline) is at work on a build
    cache: the pipeline holds a shared BSD lock on a file there while it has builds left, and any
    process (the pipeline's own included: BSD locks belong to an open file, not a process)
    finds out by asking for an exclusive one. A change to kbench's files seen while builds ran
    beside a submission's code cannot be pinned on that submission."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = Path(cache_dir) / BUILDING_NAME
        self._held: int | None = None

    def hold(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._held = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._held, fcntl.LOCK_SH)

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held)  # releases the lock
            self._held = None

    def repaired(self) -> None:
        """Count one more change the pipeline put right (``repairs`` reads the count)."""
        if self._held is not None:
            count = self.repairs() + 1
            os.pwrite(self._held, str(count).encode().ljust(20), 0)

    def repairs(self) -> int:
        """How many changes the pipeline at work on this cache has put right: a window that
        sees the count move ran beside a change it may not have seen itself."""
        try:
            return int(self.path.read_bytes().strip() or b"0")
        except (OSError, ValueError):
            return 0

    def busy(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False  # never created: no pipeline has used this cache
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing drops the probe's lock too
        return False


@dataclass(frozen=True)
class Seen:
    identity: tuple[int, int, int, int]
    data: bytes | None  # None: not kept (too large, or in the cache)


@dataclass(frozen=True)
class Guard:
    """``restorable``: files and folders whose files are kept and restored; ``cache``: folders
    of build folders (one level down), deleted whole when anything in them changes;
    ``shared``: those of them that other kbench processes may write too (see Presence)."""

    restorable: tuple[Path, ...]
    cache: tuple[Path, ...] = ()
    shared: tuple[Path, ...] = ()

    def snapshot(self, ignore: Iterable[Path] = (), shared: bool = True,
                 known: dict[Path, Seen] | None = None) -> dict[Path, Seen]:
        """Every watched file, except those under ``ignore`` (what kbench itself will write
        meanwhile: logs, the submission's own build folder) and, unless ``shared``, those in
        the shared folders. ``known``: an earlier snapshot, whose kept bytes serve files of
        the same identity again without reading them."""
        return self._scan(self._skipped(ignore, shared), keep_bytes=True, known=known)

    def repair(self, before: dict[Path, Seen], ignore: Iterable[Path] = (),
               shared: bool = True, undo: bool = True) -> list[str]:
        """What changed since ``before`` (taken with the same ``ignore`` and ``shared``), one
        line per file saying what was done about it, after putting it right (unless not
        ``undo``: another process puts it right); an empty list when nothing did."""
        skip = self._skipped(ignore, shared)
        after = self._scan(skip, keep_bytes=False)
        skipped = frozenset(skip)
        before = {path: seen for path, seen in before.items() if not _under(path, skipped)}
        lines = []
        for path in sorted(set(before) | set(after)):
            old, new = before.get(path), after.get(path)
            if old is not None and new is not None and (
                    old.identity == new.identity or _holds(path, old.data)):
                continue
            what = "new" if old is None else "deleted" if new is None else "changed"
            done = self._undo(path, old) if undo else "left to the build pipeline"
            lines.append(f"{path} ({what}, {done})")
        return lines

    def _scan(self, skip: tuple[Path, ...], keep_bytes: bool,
              known: dict[Path, Seen] | None = None) -> dict[Path, Seen]:
        seen: dict[Path, Seen] = {}
        known = known or {}
        skipped = frozenset(skip)
        for root, keep in [(r, True) for r in self.restorable] + [(c, False) for c in self.cache]:
            for path in _files(Path(root).resolve(), skipped):
                if path.name.endswith(_VOLATILE) or path.name in (LOCK_NAME, BUILDING_NAME):
                    continue
                try:
                    identity = _identity(path)
                    keep_these = keep and keep_bytes and identity[1] <= _KEEP_BYTES
                    old = known.get(path)
                    if old is not None and old.identity == identity and (
                            old.data is not None or not keep_these):
                        seen[path] = old
                        continue
                    seen[path] = Seen(identity, path.read_bytes() if keep_these else None)
                except OSError:
                    continue
        return seen

    def _skipped(self, ignore: Iterable[Path], shared: bool) -> tuple[Path, ...]:
        return tuple(Path(p).resolve() for p in (*ignore, *(() if shared else self.shared)))

    def _undo(self, path: Path, old: Seen | None) -> str:
        folder = self._build_folder(path)
        try:
            if folder is not None:
                if folder.is_dir():
                    shutil.rmtree(folder, ignore_errors=True)
                else:
                    folder.unlink(missing_ok=True)
                return "build folder deleted"
            if old is None:
                path.unlink(missing_ok=True)
                return "removed"
            if old.data is None:
                return "too large to restore"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.kbench-restore")
            tmp.write_bytes(old.data)
            os.replace(tmp, path)
            return "restored"
        except OSError as exc:
            return f"could not undo: {exc}"

    def _build_folder(self, path: Path) -> Path | None:
        for root in self.cache:
            root = Path(root).resolve()
            if root in path.parents:
                return root / path.relative_to(root).parts[0]
        return None


def _holds(path: Path, data: bytes | None) -> bool:
    """Does the file hold ``data`` again (rewritten as it was, or put right by another
    process)?"""
    try:
        return data is not None and path.read_bytes() == data
    except OSError:
        return False


def _under(path: Path, roots: frozenset[Path]) -> bool:
    return path in roots or any(parent in roots for parent in path.parents)


def _files(root: Path, skipped: frozenset[Path] = frozenset()) -> list[Path]:
    """The files under ``root``, not descending into ``skipped`` folders (a run's build
    folders and logs: thousands of files a scan would otherwise list to throw away)."""
    if _under(root, skipped):
        return []
    if root.is_file():
        return [root]
    found = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if d != "__pycache__" and here / d not in skipped]
        found += [p for p in (here / n for n in names) if p not in skipped]
    return found


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
