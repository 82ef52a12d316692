"""A build folder that kbench owns: one builder at a time, and nothing a dead build left.

torch up to 2.13 guards a build folder with a ``lock`` file that only a clean exit removes; a
build killed mid-way (kbench stopped, a lost machine) leaves it, and every later build of that
folder waits for it forever. kbench therefore builds each folder under a lock of its own, a BSD
lock (flock) that the kernel drops when its holder dies, however it dies. Holding it, no
builder of kbench's is in the folder, so what a dead one left can go: the processes it left
running (kbench.host.proctree.sweep_abandoned), torch's ``lock`` files, and outputs that ninja
never recorded as finished (half-written objects or libraries). What ninja finished is kept,
so a build that was interrupted continues where it stopped."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path

from kbench.host import proctree

LOCK_NAME = ".kbench-build.lock"
_OUTPUTS = (".o", ".so", ".pyd", ".dll", ".lib", ".exp", ".a", ".obj")
_LIVE_LOADER_S = 2.0  # a live torch (before 2.14) holds its lock file this long at most to load


class Busy(Exception):
    """Another live kbench process is building this folder (its pid in the message)."""


@contextlib.contextmanager
def held(folder: Path, wait_s: float) -> Iterator[list[str]]:
    """Hold ``folder``'s build lock, waiting up to ``wait_s`` for another kbench process that
    holds it (Busy after that), and yield what was cleared of a dead build's leftovers."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    who = "another build of this run" if holder == str(os.getpid()) else \
                        f"another kbench process (pid {holder})"
                    raise Busy(f"{folder} is being built by {who}") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield clear(folder)
    finally:
        os.close(fd)  # releases the lock


def clear(folder: Path) -> list[str]:
    """What a dead build left in ``folder`` removed (call holding its lock); what was done."""
    blocking = _existence_blocks()
    stale = [p for p in folder.glob("*/lock") if blocking and _unheld(p)]
    partial = [p for sub in folder.iterdir() if (sub / "build.ninja").exists()
               for p in _unfinished(sub)] if folder.exists() else []
    if not stale and not partial:
        return []
    done = []
    if swept := proctree.sweep_abandoned():
        done.append(f"killed {len(swept)} process(es) an interrupted build left running")
    for path in stale:
        _remove_when_stale(path)
    if stale:
        done.append(f"removed torch's lock left by an interrupted build "
                    f"({', '.join(p.parent.name for p in stale)})")
    for path in partial:
        path.unlink(missing_ok=True)
    if partial:
        done.append(f"removed {len(partial)} output(s) ninja never finished "
                    f"({', '.join(p.name for p in partial[:3])})")
    return done


@functools.cache
def _existence_blocks() -> bool:
    """Does this torch's build lock block on a lock file's mere existence (FileBaton, up to
    2.13), rather than on an OS lock that dies with its holder (2.14 and later, which leave
    the file behind after every build)? Read from the lock ``_jit_compile`` takes; anything
    unrecognised is taken to block."""
    from torch.utils import cpp_extension

    compile_names = getattr(getattr(cpp_extension, "_jit_compile", None), "__code__", None)
    if compile_names is None or "FileLock" not in compile_names.co_names:
        return True
    lock = getattr(cpp_extension, "FileLock", None)
    return not getattr(lock, "__module__", "").startswith(("torch.utils._filelock", "filelock"))


def _unheld(path: Path) -> bool:
    """No live process holds an OS lock on torch's lock file (torch 2.14 and later hold one
    while they build or load; earlier releases only create the file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove_when_stale(path: Path) -> None:
    """Remove torch's lock file once it is older than a live load takes: another kbench
    process may be loading this build (before torch 2.14 the file alone is the lock, and its
    loader removes it within moments)."""
    with contextlib.suppress(OSError):
        age = time.time() - path.stat().st_mtime
        if age < _LIVE_LOADER_S:
            time.sleep(_LIVE_LOADER_S - age)
        path.unlink()


def _unfinished(build: Path) -> list[Path]:
    """Outputs in a torch build folder that ninja's log does not record as finished: a
    compiler or linker killed mid-write leaves them, and ninja would take one for done."""
    logged: set[str] = set()
    with contextlib.suppress(OSError):
        for line in (build / ".ninja_log").read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) >= 5 and not line.startswith("#"):
                logged.add(fields[3])
    return [p for p in build.iterdir()
            if p.is_file() and p.name.endswith(_OUTPUTS) and p.name not in logged]
