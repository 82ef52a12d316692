"""The trust boundary: one child process that runs untrusted code, and the only way to talk to it.

The child (``python -m kbench.worker``) starts in its own session and process group, in a
scratch working directory, with stdout and stderr going to a log file and never read as
results. Requests and answers travel over a private socket. Every request has a deadline;
the parent watches the child's exit, its memory and its log size while it waits, and kills
the whole process tree (group, then any stray descendants found by psutil) on any breach.
kbench adopts the orphans of its workers' descendants (child subreaper), so one that left the
tree and its session is still found, by a mark in its environment, and killed with the worker;
while the reference is timed, a candidate's processes are stopped (``Sandbox.frozen``).

Answers are unpickled with an allow-list: tensors (shared memory or CUDA IPC handles) and
plain data only, so nothing the child sends can make the parent import or run its code.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.multiprocessing  # noqa: F401  (registers tensor sharing with the pickler)

from kbench.host import interrupt, paths, proctree, spawn
from kbench.shared import protocol

_POLL_S = 0.05
_STOP_WAIT_S = 2.0  # a thread in an uninterruptible call stops when it returns from it
_LIMITS_S = 0.5  # memory and log checks: a walk of the worker's tree each
_MAX_MESSAGE = 64 << 20
_EXIT_GRACE_S = 10.0

_ALLOWED_GLOBALS = {
    ("torch", "Tensor"), ("torch", "Size"), ("multiprocessing.resource_sharer", "DupFd"),
    *(("torch.multiprocessing.reductions", name) for name in (
        "rebuild_tensor", "rebuild_cuda_tensor", "rebuild_typed_storage", "rebuild_storage_fd",
        "rebuild_storage_filename", "rebuild_storage_empty")),
}
_STORAGE_MODULES = ("torch", "torch.storage")


class Fate(str, Enum):
    """What became of a worker that gave no answer (results/verdict.py makes it a verdict)."""

    CRASHED = "crashed"  # died, or was killed for flooding its log
    TIMEOUT = "timeout"
    OUT_OF_MEMORY = "out_of_memory"  # over its resident-memory limit
    MALFORMED = "malformed"  # sent bytes that are not an allowed answer


class SandboxFailure(Exception):
    """The child broke a rule or died: ``fate`` says how."""

    def __init__(self, fate: Fate, message: str) -> None:
        super().__init__(message)
        self.fate = fate
        self.message = message


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module in _STORAGE_MODULES:
            found = getattr(sys.modules[module], name, None)
            if isinstance(found, torch.dtype) or (isinstance(found, type) and issubclass(
                    found, (torch.storage.TypedStorage, torch.UntypedStorage))):
                return found
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


def safe_loads(data: bytes) -> Any:
    """Unpickle an answer from the child, refusing every global outside the allow-list."""
    return _AllowListUnpickler(io.BytesIO(data)).load()


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment, kbench importable from anywhere, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBENCH_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(paths.PACKAGE_DIR.parent), env.get("PYTHONPATH")) if p)
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


class Sandbox:
    """One worker process. Use as a context manager; ``request`` raises SandboxFailure."""

    def __init__(self, log_path: Path, env: dict[str, str], memory_bytes: int,
                 log_bytes: int, cpus: tuple[int, ...] = (), nice: int = 0) -> None:
        self.final_log_path = log_path
        self.memory_bytes = memory_bytes
        self.log_bytes = log_bytes
        started = spawn.take(log_path, env)
        # One started elsewhere (a spare, on spare cores) joins its caller's cores.
        _place(started.proc.pid, cpus or (tuple(sorted(os.sched_getaffinity(0)))
                                          if started.cpus else ()), nice)
        self.log_path, self.scratch, self.marks = started.log_path, started.scratch, started.marks
        self.proc, self.conn = started.proc, started.conn
        # Strays that appear later are this worker's (frozen); on the clock psutil reads.
        self.started = _created(self.proc.pid)
        self.freezes = 0  # frozen blocks open on it
        self.frozen_s = 0.0  # seconds it has spent frozen, the open block's excluded
        self.frozen_since = 0.0

    def place(self, cpus: tuple[int, ...]) -> None:
        """The worker on ``cpus`` from now on (one prepared on spare cores, taking its turn)."""
        _place(self.proc.pid, cpus, 0)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, message: protocol.Request, timeout: float) -> object:
        """Send one request; return the child's answer within ``timeout`` seconds, unpickled
        with the allow-list but not yet decoded (kbench.shared.protocol.decode does that).
        Once kbench is told to stop (kbench.host.interrupt), a failure is kbench's doing:
        Interrupted, never a verdict."""
        try:
            return self._request(message, timeout)
        except SandboxFailure:
            interrupt.check()
            raise

    def _request(self, message: protocol.Request, timeout: float) -> object:
        self._continued()
        try:
            self.conn.send(protocol.encode(message))
        except OSError:
            self._raise_if_dead(wait=True)
            raise SandboxFailure(Fate.CRASHED, "the worker closed its channel") from None
        # kbench holding it stopped (frozen, from another thread) is not the worker's time
        deadline, paused = time.monotonic() + timeout, self.frozen_s
        checked = 0.0
        while not self.conn.poll(_POLL_S):
            self._raise_if_dead()
            self._continued()
            if time.monotonic() - checked > _LIMITS_S:
                self._enforce_limits()
                checked = time.monotonic()
            if not self.freezes and time.monotonic() > deadline + self.frozen_s - paused:
                self.kill()
                raise SandboxFailure(Fate.TIMEOUT, f"no answer within {timeout:g} s (the task's "
                                     "limits set this)")
        try:
            data = self.conn.recv_bytes(_MAX_MESSAGE)
        except (EOFError, OSError):
            self._raise_if_dead(wait=True)
            raise SandboxFailure(Fate.CRASHED, "the worker closed its channel") from None
        try:
            answer = safe_loads(data)
        except Exception as exc:
            self.kill()
            message = f"the worker sent an answer kbench does not accept ({exc})"
            raise SandboxFailure(Fate.MALFORMED, message) from None
        return answer

    def _continued(self) -> None:
        """The worker continued, before a request and while kbench waits for its answer: another
        worker may have stopped it (SIGSTOP), and have ended before it continued it. Not while
        kbench itself holds it stopped (``frozen``, from another thread)."""
        if self.proc.returncode is None and not self.freezes:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def _raise_if_dead(self, wait: bool = False) -> None:
        code = proctree.exited(self.proc, _EXIT_GRACE_S if wait else 0.0)
        if code is None:
            return
        self.kill()
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
            hint = " (the kernel's out-of-memory killer sends this)" if name == "SIGKILL" else ""
            raise SandboxFailure(Fate.CRASHED, f"worker killed by signal {name}{hint}")
        raise SandboxFailure(Fate.CRASHED, f"worker exited with status {code} mid-request")

    def _enforce_limits(self) -> None:
        size = self.log_path.stat().st_size if self.log_path.exists() else 0
        if size > self.log_bytes:
            self.kill()
            raise SandboxFailure(Fate.CRASHED, f"wrote over {self.log_bytes >> 20} MiB to "
                                                 "stdout/stderr; stopped")
        rss = sum(proctree.rss(p) for p in self._tree())
        if rss > self.memory_bytes:
            self.kill()
            raise SandboxFailure(Fate.OUT_OF_MEMORY, f"resident memory {rss / 2**30:.1f} GiB "
                                 f"above the {self.memory_bytes / 2**30:g} GiB limit")

    def _tree(self) -> list[psutil.Process]:
        if self.proc.returncode is not None:  # reaped: its pid may be another process's now
            return []
        pids = proctree.descendants(self.proc.pid)
        if pids is not None:
            found = []
            for pid in [self.proc.pid, *pids]:
                with contextlib.suppress(psutil.Error):
                    found.append(psutil.Process(pid))
            return found
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The worker's processes stopped (SIGSTOP) meanwhile, those that left its tree too:
        while the reference is timed, none can run, signal it or compete for the host. Stopped
        in rounds until no new one shows up (a process may fork as it is listed); strays are
        found by the mark in their environment and, for one that cleared it, as children this
        process adopted since the worker started, outside kbench's own session (never what
        kbench started itself: kbench.host.proctree.strays). Not
        left before every thread of each is seen stopped (a thread still running could stop
        the reference after it was continued)."""
        stopped: dict[int, psutil.Process] = {}
        if not self.freezes:
            self.frozen_since = time.monotonic()
        self.freezes += 1  # no request of another thread continues it meanwhile
        try:
            for _ in range(5):
                with spawn.settled() as kbench_s:
                    new = [p for p in self._tree() + proctree.marked(self.marks, kbench_s)
                           + proctree.strays(self.started, kbench_s) if p.pid not in stopped]
                    for proc in new:
                        with contextlib.suppress(psutil.Error):
                            proc.suspend()
                            stopped[proc.pid] = proc
                if not new:
                    break
            deadline = time.monotonic() + _STOP_WAIT_S
            while not all(proctree.stopped(pid) for pid in stopped) and \
                    time.monotonic() < deadline:
                time.sleep(0.001)
            yield
        finally:
            for proc in stopped.values():
                with contextlib.suppress(psutil.Error):
                    proc.resume()
            self.freezes -= 1
            if not self.freezes:
                self.frozen_s += time.monotonic() - self.frozen_since

    def kill(self) -> None:
        """Kill the worker's process group and every descendant that left it. The worker is
        reaped only after its group is killed: until then its pid, which names the group, is
        not given to another process (pids are reused, and a grader must never signal another
        run's processes)."""
        stray = self._tree()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in stray:
            try:
                proc.kill()
            except psutil.Error:
                pass
        interrupt.drop_session(self.proc.pid)  # before it is reaped: the id is still its own
        try:
            self.proc.wait(timeout=_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        with spawn.settled() as kbench_s:
            swept = proctree.sweep(self.marks, self.proc.pid, descendants=len(stray) > 1,
                                   own=kbench_s)
        if swept:
            with contextlib.suppress(OSError), open(self.log_path, "a") as log:
                log.write(f"\nkbench: killed what the worker left running after it: "
                          f"{', '.join(swept)}\n")

    def close(self) -> None:
        """Ask the worker to exit, then make sure its whole tree is gone."""
        if proctree.exited(self.proc) is None:
            with contextlib.suppress(OSError):
                self.conn.send(protocol.encode(protocol.Exit()))
                proctree.exited(self.proc, _EXIT_GRACE_S)
        self.kill()
        self.conn.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.log_path != self.final_log_path:
            with contextlib.suppress(FileNotFoundError):  # a worker may delete its own log
                os.replace(self.log_path, self.final_log_path)
            self.log_path = self.final_log_path

    def log_text(self, limit: int = 256 << 10) -> str:
        """The log, or its first and last ``limit / 2`` bytes when it is longer."""
        return read_bounded(self.log_path, limit)


def _created(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def _place(pid: int, cpus: tuple[int, ...], nice: int) -> None:
    """Keep a process (and what it starts) on ``cpus`` at ``nice``: builds run on their own
    cores at low priority, away from the cores timing runs on
    (kbench.grading.building.hostsplit)."""
    with contextlib.suppress(psutil.Error, OSError, ValueError):
        proc = psutil.Process(pid)
        if cpus:
            proc.cpu_affinity(list(cpus))
        if nice:
            proc.nice(nice)


def remove_stale_logs(folder: Path) -> None:
    """Delete private log files left by graders that were killed (their pid is gone)."""
    for path in folder.glob(".*.log.*.*"):
        pid = path.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            path.unlink(missing_ok=True)


def read_bounded(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= limit:
                return f.read().decode(errors="replace")
            head = f.read(limit // 2)
            f.seek(size - limit // 2)
            tail = f.read()
    except OSError:
        return ""
    return (head.decode(errors="replace") + f"\n[... {size - limit} bytes cut ...]\n"
            + tail.decode(errors="replace"))
