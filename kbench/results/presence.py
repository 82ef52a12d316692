"""A kbench process's mark in a folder that other kbench processes may use at the same time
(the results store's folder, the build cache): the store holds one where it writes, the file
guard (kbench.grading.building.guard) compares shared folders only where its process was alone, and
``kbench prune`` empties a cache only where nobody else is at work."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".kbench-presence"


class Presence:
    """This process's mark in a folder other kbench processes may use too: a POSIX read lock
    on a file there, which the kernel drops when the process ends (even on kill -9) and which
    no child inherits."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.lockf(self._fd, fcntl.LOCK_SH)
        self.folder = folder

    def alone(self) -> bool:
        """No other process holds a mark here (POSIX locks are per process, so this one's own
        read lock can be upgraded exactly when nobody else holds one)."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.lockf(self._fd, fcntl.LOCK_SH)
        return True

    def others(self) -> list[int]:
        """The ids of the other processes holding a mark here, from Linux's /proc/locks
        (empty where it cannot be read)."""
        try:
            where = os.fstat(self._fd)
            table = Path("/proc/locks").read_text()
        except OSError:
            return []
        inode = f":{where.st_ino}"
        pids = {int(fields[4]) for fields in map(str.split, table.splitlines())
                if len(fields) > 5 and fields[1] == "POSIX" and fields[5].endswith(inode)
                and fields[4].isdigit()}
        return sorted(pids - {os.getpid()})

    def close(self) -> None:
        os.close(self._fd)  # releases the lock
