"""What kbench processes on this host are doing: each build and each timing logged with its
start and end, one file per process in the build cache's ``activity`` folder, so that a slot
can say which builds and timings ran beside a submission's timing (the reports show them, and
kbench.grading.timing.disturbance defers a flag raised meanwhile). Bookkeeping only: a log that
cannot be written or read never fails a grade, and since a submission's process could write
here too, what it says may only ever cause a timing to be repeated, never excuse one."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

FOLDER = "activity"
_KEEP_S = 6 * 3600  # a dead process's log is removed this long after its last entry


@dataclass(frozen=True)
class Span:
    kind: str  # "build" or "timing"
    name: str  # what was built or timed, as reports name it
    pid: int
    start: float  # time.time()
    end: float | None  # None: still running

    def text(self) -> str:
        return f"{self.kind} of {self.name}"


class Log:
    """The host's activity log under ``cache_dir``."""

    def __init__(self, cache_dir: Path) -> None:
        self.folder = Path(cache_dir) / FOLDER

    @contextlib.contextmanager
    def record(self, kind: str, name: str) -> Iterator[Span]:
        """The block, logged as a span of ``kind`` by this process."""
        span = Span(kind, name, os.getpid(), time.time(), None)
        self._write({"kind": kind, "name": name, "start": span.start})
        try:
            yield span
        finally:
            self._write({"kind": kind, "name": name, "start": span.start, "end": time.time()})

    def beside(self, mine: Span, end: float | None = None) -> list[Span]:
        """Every span of another kind or process that overlapped ``mine`` (from its start to
        ``end``, else now): a process times one thing at a time, so its other timings (the
        reference's rounds alternating with a submission's) are part of the same one."""
        end = time.time() if end is None else end
        return [s for s in self.spans() if s.start < end
                and (s.end is None or s.end > mine.start)
                and not (s.pid == mine.pid and s.kind == mine.kind)]

    def spans(self) -> list[Span]:
        found: list[Span] = []
        with contextlib.suppress(OSError):
            for path in self.folder.glob("*.jsonl"):
                found += _read(path)
        return found

    def _write(self, entry: dict) -> None:
        path = self.folder / f"{os.getpid()}.jsonl"
        with contextlib.suppress(OSError):
            if not path.exists():
                self.folder.mkdir(parents=True, exist_ok=True)
                self._prune()
            line = (json.dumps(entry) + "\n").encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write of a short line: appended whole
            finally:
                os.close(fd)

    def _prune(self) -> None:
        for path in self.folder.glob("*.jsonl"):
            with contextlib.suppress(OSError, ValueError):
                if not psutil.pid_exists(int(path.stem)) and \
                        time.time() - path.stat().st_mtime > _KEEP_S:
                    path.unlink()


def _read(path: Path) -> list[Span]:
    """One process's spans; one whose process died before it ended ends at the log's last
    write (the process's last sign of life there)."""
    try:
        pid = int(path.stem)
        text = path.read_text()
        last = path.stat().st_mtime
    except (OSError, ValueError):
        return []
    open_: dict[tuple[str, str, float], float | None] = {}
    for line in text.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(line)
            key = (str(entry["kind"]), str(entry["name"]), float(entry["start"]))
            end = entry.get("end")
            open_[key] = float(end) if end is not None else open_.get(key)
    alive = psutil.pid_exists(pid)
    return [Span(kind, name, pid, start, end if end is not None or alive else last)
            for (kind, name, start), end in open_.items()]
