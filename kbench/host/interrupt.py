"""kbench's own stop (Ctrl-C, SIGTERM, a slot told to end): what it interrupted is never a
submission's fault.

The first signal marks the stop and kills, at once, every process of each worker this process
started (a worker is a session of its own: a build's compilers are in it), tells the slot
processes it started to stop too, and raises ``Interrupted`` in the main thread, as Ctrl-C
raises KeyboardInterrupt. Nothing new starts after it (kbench.sandbox raises ``Interrupted``), and a
worker that fails once the stop is marked raises ``Interrupted`` instead of earning a verdict,
so what it was doing is not stored and ``--resume`` grades it. A second signal ends the
process at once."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import psutil

_requested: int | None = None  # the signal that asked for the stop
_sessions: set[int] = set()  # sessions of this process's live workers (each its own)
_children: set[int] = set()  # slot processes of this process: told to stop with SIGTERM
_announce = True  # say so on stderr (the command's process; a slot stops quietly)


class Interrupted(BaseException):
    """kbench was told to stop: unwinds past every ``except Exception`` to the command,
    which keeps what is stored and says how to resume. Not an error of any submission."""

    def __init__(self, signum: int | None = None) -> None:
        self.signum = signum or _requested or signal.SIGINT
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")
        self.run_id: int | None = None  # the run it interrupted, once known


def requested() -> bool:
    return _requested is not None


def check() -> None:
    """Raise Interrupted if the stop is marked (before starting anything new)."""
    if _requested is not None:
        raise Interrupted()


def add_session(sid: int) -> None:
    _sessions.add(sid)


def drop_session(sid: int) -> None:
    _sessions.discard(sid)


def add_child(pid: int) -> None:
    _children.add(pid)


def drop_child(pid: int) -> None:
    _children.discard(pid)


def stop(signum: int) -> None:
    """Mark the stop and kill what this process runs: its workers' whole sessions at once, its
    slot processes told to stop (they kill their own workers the same way)."""
    global _requested
    if _requested is None:
        _requested = signum
    _kill_sessions(set(_sessions))
    for pid in list(_children):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def _kill_sessions(sids: set[int]) -> None:
    """Kill every process of these sessions (each worker's: ninja runs each compiler in a
    process group of its own, inside it), read from /proc without taking any lock."""
    for sid in sids:
        with contextlib.suppress(OSError):
            os.killpg(sid, signal.SIGKILL)
    if not sids:
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[3]) in sids:
                        os.kill(int(entry), signal.SIGKILL)


def _handle(signum: int, frame: object) -> None:
    if _requested is not None:  # the second: end now, leaving nothing running
        for pid in list(_children):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        stop(signum)
        os._exit(128 + signum)
    stop(signum)
    if _announce:
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), f"\nkbench: {signal.Signals(signum).name}: stopping "
                     "(what is finished is kept; a second one ends kbench at once)\n".encode())
    raise Interrupted(signum)  # the main thread unwinds from wherever it waits


def install(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM), announce: bool = True
            ) -> None:
    """Take ``signals`` in this process (call from its main thread)."""
    global _announce
    _announce = announce
    if threading.current_thread() is not threading.main_thread():
        return  # Python takes signals in the main thread only; the caller's is not it
    for signum in signals:
        signal.signal(signum, _handle)


def wait_children(wait_s: float = 10.0) -> None:
    """Wait for the slot processes told to stop, killing those still there after ``wait_s``
    (after a stop, from the main thread)."""
    procs = []
    for pid in list(_children):
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=wait_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def reset() -> None:
    """Forget a stop (for a process that grades again after one, such as a test's)."""
    global _requested
    _requested = None
    _sessions.clear()
    _children.clear()
