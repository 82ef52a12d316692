"""Reading process trees: a worker's descendants, the adopted orphans that carry its mark, and
resident memory; kept apart from kbench.sandbox, which acts on what these find."""

from __future__ import annotations

import contextlib
import os

import psutil

MARK = "KBENCH_SANDBOX_MARK"


def marked(mark: str) -> list[psutil.Process]:
    """This process's children with ``mark`` in their environment (zombies have none)."""
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.environ().get(MARK) == mark:
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
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                if parent == pid and not found and not os.path.exists(
                        f"/proc/{parent}/task/{task}/children"):
                    return None
                continue
            except (OSError, ValueError):
                continue
            found += children
            todo += children
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
