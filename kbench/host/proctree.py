"""Process trees around kbench's workers: their descendants, the orphans kbench adopts and
finds by a mark or as strays, whether every thread is stopped, resident memory, and the sweep
that kills and reaps what a worker left behind (kbench.sandbox acts on what these find)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import time

import psutil

MARK = "KBENCH_SANDBOX_MARK"
OWNER = "KBENCH_OWNER"  # "pid:start time" of the kbench process that started a worker
_PR_SET_CHILD_SUBREAPER = 36
_ADOPTING = False
_EXIT_GRACE_S = 10.0


def marked(marks: tuple[str, ...], own: set[int]) -> list[psutil.Process]:
    """This process's children with one of ``marks`` in their environment (zombies have
    none), but for those in ``own`` (workers forked from a zygote show the zygote's mark:
    kbench.host.spawn)."""
    found = []
    for child in children():
        with contextlib.suppress(psutil.Error):
            if child.pid not in own and child.environ().get(MARK) in marks:
                found.append(child)
    return found


def descendants(pid: int) -> list[int] | None:
    """``pid``'s descendants, read from Linux's /proc/PID/task/TID/children: the tree alone,
    where psutil reads every process of the host to find it (dozens of builds polled at once
    made that the grader's whole CPU). None where the kernel keeps no such file."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        children = _children_of(parent)
        if children is None:
            if parent == pid:
                return None
            continue
        found += children
        todo += children
    return found


def children() -> list[psutil.Process]:
    """This process's children, from the kernel's lists of each of its threads' (a child
    adopted as an orphan may be any thread's), where psutil reads every process of the host
    to find them: a worker's freeze asked twice, 2.4 s of one submission's timing on a
    16-core GPU host while builds ran. psutil's answer where the kernel keeps no list."""
    pids = _children_of(os.getpid())
    if pids is None:
        return psutil.Process().children()
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def _children_of(pid: int) -> list[int] | None:
    """The children of every thread of ``pid`` (empty once it is gone); None where the
    kernel keeps no children file."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{task}"):
                continue  # the thread ended meanwhile
            return None
        except (OSError, ValueError):
            continue
    return found


def rss(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` stopped (or gone): SIGSTOP takes effect thread by thread, and
    a thread still running may yet send a signal or take a core."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X", "x"):
            return False
    return True


def strays(since: float, own: set[int]) -> list[psutil.Process]:
    """This process's children started at ``since`` or later (psutil's create_time, which
    counts in clock ticks from boot, not time.time()) that are not in ``own`` and still run,
    outside this process's session: orphans adopted here (kbench is its workers' child
    subreaper), whatever their environment says (a mark there is the submission's to forge).
    A worker starts a session of its own and no process can join another, so a child in
    kbench's session is one kbench started itself (a compiler, nvidia-smi) and stays running;
    another worker's orphan is stopped too, which only delays it."""
    found = []
    session = os.getsid(0)
    for child in children():
        with contextlib.suppress(psutil.Error, OSError):
            if child.pid not in own and child.create_time() >= since and \
                    child.status() != psutil.STATUS_ZOMBIE and os.getsid(child.pid) != session:
                found.append(child)
    return found


def adopt_orphans() -> None:
    """Make this process the one that inherits its descendants' orphans (Linux's child
    subreaper), so that a process a worker left behind by forking twice and leaving its session
    becomes a child of kbench, where ``sweep`` finds it, instead of init's."""
    global _ADOPTING
    if not _ADOPTING and sys.platform == "linux":
        _ADOPTING = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0,
                                                            0) == 0


def adopting() -> bool:
    """Whether this process adopts its descendants' orphans (see adopt_orphans)."""
    return _ADOPTING


def sweep(marks: tuple[str, ...], worker: int, descendants: bool, own: set[int]
          ) -> list[str]:
    """Kill this process's children that carry one of ``marks`` in their environment (a worker's
    descendants that left its tree, adopted here: see adopt_orphans), in a few rounds, as one
    may be forking more; then reap those, and the zombies of the worker's session (its
    ``descendants``, killed, adopted here as their parents died). Nothing else is reaped:
    another thread's subprocess must get its own exit status. One that cleared its
    environment on exec is not found."""
    swept: list[str] = []
    for _ in range(5):
        found = [p for p in marked(marks, own) if p.pid != worker]
        if not found:
            break
        for child in found:
            with contextlib.suppress(psutil.Error):
                swept.append(f"pid {child.pid} ({child.name()})")
                for proc in [*child.children(recursive=True), child]:
                    with contextlib.suppress(psutil.Error):
                        proc.kill()
        psutil.wait_procs(found, timeout=_EXIT_GRACE_S)  # children: this reaps them
    for _ in range(3 if descendants or swept else 0):
        time.sleep(0.02)  # a killed process's children are adopted as it dies
        for child in children():
            with contextlib.suppress(psutil.Error, OSError):
                if child.pid != worker and child.status() == psutil.STATUS_ZOMBIE \
                        and os.getsid(child.pid) == worker:
                    os.waitpid(child.pid, os.WNOHANG)
    return swept


def owner_token() -> str:
    """This process as its workers' owner: its pid and start time (a pid alone may be reused)."""
    return f"{os.getpid()}:{psutil.Process().create_time():.3f}"


def _owner_gone(token: str) -> bool:
    pid, _, started = token.partition(":")
    try:
        return f"{psutil.Process(int(pid)).create_time():.3f}" != started
    except (psutil.NoSuchProcess, ValueError):
        return True
    except psutil.Error:
        return False


def sweep_abandoned() -> list[str]:
    """Kill what kbench processes that died (kill -9, a lost machine) left running: every
    process whose environment names an owner that is gone (a build's compilers outlive their
    worker, which dies with its owner; processes stopped while the owner timed are among
    them). Those of live kbench processes, and everything else on the host, are left alone.
    One that cleared its environment is not found."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            token = proc.environ().get(OWNER)
            if token and _owner_gone(token):
                found.append(proc)
    for proc in found:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(found, timeout=_EXIT_GRACE_S)
    return [f"pid {p.pid}" for p in found]


def exited(proc: subprocess.Popen, wait_s: float = 0.0) -> int | None:
    """A child's exit status once it has exited (negative: the signal), else None after
    ``wait_s``. It is left unreaped, so that its pid, which names its process group, is not
    given to another process before the caller has killed that group (kbench.sandbox)."""
    deadline = time.monotonic() + wait_s
    while proc.returncode is None:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped already
            return proc.poll()
        if info is not None:
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)
    return proc.returncode
