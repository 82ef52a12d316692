"""Worker processes started: forked from a zygote where one is ready (kbench.worker.zygote: torch
imported, no GPU touched), else as a new ``python -m kbench.worker``; and spares started ahead
of need, each used once by the Sandbox that asks for its log (kbench.sandbox).

A worker's start was torch's import, some 2 s of a core and far more on a busy host: on an
H100 host, fresh-process rounds waited 5 s a submission for theirs. A fork of a process that
has imported it costs tens of milliseconds. What a fresh process reads as it starts (the
environment at torch's import, the CPU affinity its thread pools size themselves by) is the
same: a zygote serves only workers whose environment matches its own but for the variables
read later (``PER_WORKER``), started from a thread with the same affinity. The first worker of
such a kind starts plainly while its zygote starts beside it, so no worker waits for one.

Forked workers are adopted by kbench (its child subreaper): kbench waits for them and kills
their sessions as for processes it started. Their environment as Linux shows it
(/proc/PID/environ) is the zygote's, whose mark they carry besides their own; what they start
carries their own (kbench.host.proctree)."""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

from kbench.host import interrupt, proctree

# Read by a worker after it starts (by torch's extension builder, the kernel languages'
# caches, kbench's own wrappers), never at torch's import: a zygote serves workers whose
# environments differ only here.
PER_WORKER = frozenset({"TORCH_EXTENSIONS_DIR", "MAX_JOBS", "TRITON_CACHE_DIR",
                        "TORCHINDUCTOR_CACHE_DIR", "HOME",
                        "XDG_CACHE_HOME", "KBENCH_PREBUILT", "CXX", "TORCH_CUDA_ARCH_LIST",
                        "CPATH", "LIBRARY_PATH", proctree.MARK})
_READY_WAIT_S = 120.0  # a zygote that has not imported torch by then is given up
_ANSWER_S = 30.0
_EXIT_GRACE_S = 10.0

_OWN: set[int] = set()  # the processes kbench started itself: workers, zygotes, slots
_FORKING = threading.RLock()  # held from a fork's request until its worker is in _OWN


def own(pid: int) -> None:
    """Mark a process this one started as kbench's own (never taken for a stray)."""
    _OWN.add(pid)


@contextlib.contextmanager
def settled() -> Iterator[set[int]]:
    """kbench's own processes, with no worker being forked meanwhile. A forked worker is
    adopted here, showing its zygote's mark, before its pid reaches kbench: a sweep of a
    sibling's escapees (which show that mark too) in those milliseconds killed it (a bundled
    problem's build crashed with SIGKILL under --jobs 2)."""
    with _FORKING:
        yield _OWN


class Adopted:
    """A forked worker as kbench holds it: its pid, and its exit status read as its parent
    (kbench adopted it), with the part of subprocess.Popen's interface kbench uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not adopted here after all: alive or not, by its pid
                if not _alive(self.pid):
                    self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode


class Started:
    """A worker process as started: torch imported by the time it is first asked anything,
    and, where it was started as a spare for a CUDA device, its CUDA context made."""

    def __init__(self, log_path: Path, env: dict[str, str], device: str = "",
                 cpus: tuple[int, ...] = ()) -> None:
        """``cpus``: where it starts (its start's work off the cores of whoever waits for it:
        the Sandbox that takes it puts it on its caller's), else on this thread's."""
        interrupt.check()  # nothing new starts once kbench is told to stop
        self.cpus = cpus
        # Written under a private name, renamed into place on close: two graders sharing an
        # output folder never interleave their logs.
        self.env = env
        self.log_path = log_path.with_name(f".{log_path.name}.{os.getpid()}.{id(self):x}")
        self.scratch = Path(tempfile.mkdtemp(prefix="kbench-sandbox-"))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        parent_end, child_end = socket.socketpair()
        proctree.adopt_orphans()
        self.mark = secrets.token_hex(8)  # in the environment of all it starts (proctree.sweep)
        full = {**env, proctree.MARK: self.mark, proctree.OWNER: proctree.owner_token()}
        zygote = _zygote(env)
        self.forked_from = zygote.mark if zygote is not None else None
        with _FORKING:
            pid = zygote.fork(self.log_path, self.scratch, full, device, child_end, cpus) \
                if zygote is not None else None
            if pid is not None:
                own(pid)
        if pid is not None:
            self.proc: subprocess.Popen | Adopted = Adopted(pid)
        else:
            self.forked_from = None
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "kbench.worker", str(child_end.fileno()),
                     str(os.getpid()), device], cwd=self.scratch, env=full,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(child_end.fileno(),), start_new_session=True)
            if cpus:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(self.proc.pid, cpus)
        own(self.proc.pid)
        interrupt.add_session(self.proc.pid)  # its own session, named by its pid
        child_end.close()
        self.conn = Connection(parent_end.detach())
        self.conn.send_bytes(multiprocessing.current_process().authkey)

    @property
    def marks(self) -> tuple[str, ...]:
        """The marks its escaped descendants may carry: its own (in what it executes) and,
        for a forked worker, its zygote's (what it forks without executing shows that one)."""
        return (self.mark, self.forked_from) if self.forked_from else (self.mark,)

    def discard(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        interrupt.drop_session(self.proc.pid)  # before it is reaped, as in Sandbox.kill
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=_EXIT_GRACE_S)
        with settled() as kbench_s:
            proctree.sweep(self.marks, self.proc.pid, descendants=True, own=kbench_s)
        self.conn.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)


class Zygote:
    """One kbench.worker.zygote process and the socket its forks are asked for on."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lock = threading.Lock()
        self.ready = False
        self.broken = False
        self.mark = secrets.token_hex(8)
        self.scratch = Path(tempfile.mkdtemp(prefix="kbench-zygote-"))
        self.started = time.monotonic()
        self.sock, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(self.scratch / "zygote.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kbench.worker.zygote", str(child_end.fileno())],
                cwd=self.scratch, env={**env, proctree.MARK: self.mark}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, pass_fds=(child_end.fileno(),),
                start_new_session=True)
        child_end.close()
        own(self.proc.pid)
        interrupt.add_session(self.proc.pid)

    def fork(self, log_path: Path, scratch: Path, env: dict[str, str], device: str,
             channel: socket.socket, cpus: tuple[int, ...] = ()) -> int | None:
        """A worker forked with ``channel`` as its end, on ``cpus`` (else this thread's);
        None where this zygote is not ready (the caller starts one plainly)."""
        with self.lock:
            if not self._ready():
                return None
            request = {"log": str(log_path), "cwd": str(scratch), "env": env,
                       "device": device, "parent": os.getpid(),
                       "cpus": sorted(cpus or os.sched_getaffinity(0))}
            try:
                self._continued()
                socket.send_fds(self.sock, [json.dumps(request).encode()], [channel.fileno()])
                answer = json.loads(self._answer() or b"{}")
            except (OSError, ValueError):
                answer = {}
            if "pid" not in answer:
                self._give_up()
                return None
            return int(answer["pid"])

    def _answer(self) -> bytes:
        """Its answer to the request sent, continuing it meanwhile (a worker may stop every
        process named kbench.worker: kbench.sandbox.Sandbox._continued); b"" after _ANSWER_S."""
        deadline = time.monotonic() + _ANSWER_S
        while time.monotonic() < deadline:
            self.sock.settimeout(0.05)
            try:
                return self.sock.recv(1 << 16)
            except TimeoutError:
                self._continued()
            finally:
                self.sock.settimeout(None)
        return b""

    def _continued(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.proc.pid, signal.SIGCONT)

    def _ready(self) -> bool:
        """Whether it has said it is ready (checked without waiting)."""
        if self.ready or self.broken:
            return self.ready and not self.broken
        self._continued()
        try:
            self.sock.setblocking(False)
            said = self.sock.recv(16)
        except BlockingIOError:
            said = None
        except OSError:
            said = b""
        finally:
            self.sock.setblocking(True)
        if said == b"ready":
            self.ready = True
        elif said is not None or time.monotonic() - self.started > _READY_WAIT_S:
            self._give_up()
        return self.ready and not self.broken

    def _give_up(self) -> None:
        self.broken = True
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        interrupt.drop_session(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=_EXIT_GRACE_S)
        shutil.rmtree(self.scratch, ignore_errors=True)


_ZYGOTES: dict[tuple, Zygote] = {}
_ZYGOTES_KEPT = 4  # a run needs two (the reference's workers, the submissions'); each holds torch
_ZYGOTES_LOCK = threading.Lock()
# Off where kbench cannot adopt what the zygote forks (not Linux): it could not wait for them.
FORK = sys.platform == "linux" and os.environ.get("KBENCH_NO_ZYGOTE") is None


def warm(env: dict[str, str]) -> None:
    """Start now the zygote for workers with ``env`` (kbench.sandbox.child_env's) where there is
    none: it imports torch while other work goes on."""
    proctree.adopt_orphans()
    _zygote(env)


def ready(env: dict[str, str]) -> bool:
    """Whether a worker with ``env`` started now is forked (its zygote is ready)."""
    zygote = _zygote(env)
    if zygote is None:
        return False
    with zygote.lock:
        return zygote._ready()


def _zygote(env: dict[str, str]) -> Zygote | None:
    """The zygote for a worker with ``env``, started now if there is none (it serves the next
    worker of its kind: this one starts plainly); None where none can serve."""
    if not FORK or not proctree.adopting():
        return None
    base = {**{k: v for k, v in env.items() if k not in PER_WORKER},
            proctree.OWNER: proctree.owner_token()}
    key = (tuple(sorted(base.items())), tuple(sorted(os.sched_getaffinity(0))))
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.pop(key, None)
        if zygote is None:
            while len(_ZYGOTES) >= _ZYGOTES_KEPT:  # the least recently used ends
                _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
            with contextlib.suppress(OSError):
                _ZYGOTES[key] = Zygote(base)
            return None
        _ZYGOTES[key] = zygote  # the latest used last
    return None if zygote.broken else zygote


@atexit.register
def close_zygotes() -> None:
    """Every zygote ended (at exit, and where a test wants none left)."""
    with _ZYGOTES_LOCK:
        while _ZYGOTES:
            _ZYGOTES.popitem()[1].close()


_SPARES: dict[Path, Started] = {}  # by the log the worker will write: one spare per use


def prestart(log_path: Path, env: dict[str, str], device: str, cpus: tuple[int, ...] = ()
             ) -> None:
    """Start now the worker a Sandbox for ``log_path`` with ``env`` will use: its start (torch's
    import, the CUDA context) then overlaps other work, on ``cpus`` where given, and the
    Sandbox finds it ready. It is a fresh process all the same, used once; one asked for with
    another environment is not used."""
    if log_path not in _SPARES:
        _SPARES[log_path] = Started(log_path, env, device, cpus)


def take(log_path: Path, env: dict[str, str]) -> Started:
    """The spare started for ``log_path`` where it is alive and has ``env``, else a worker
    started now."""
    spare = _SPARES.pop(log_path, None)
    if spare is not None and spare.env == env and proctree.exited(spare.proc) is None:
        return spare
    if spare is not None:
        spare.discard()
    return Started(log_path, env)


def drop_spare(log_path: Path) -> None:
    """End the spare started for ``log_path`` if no Sandbox took it."""
    spare = _SPARES.pop(log_path, None)
    if spare is not None:
        spare.discard()


def drop_spares() -> None:
    """End the spares no Sandbox took."""
    while _SPARES:
        _SPARES.popitem()[1].discard()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
