"""Reading process trees (kbench.proctree), and stopping a worker whole (Sandbox.frozen)."""

import subprocess
import sys
import time

import psutil
import pytest

from kbench import proctree, sandbox

_SPIN = ("import threading, time\n"
         "for _ in range(4):\n"
         "    threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()\n"
         "time.sleep(60)\n")


def test_descendants_are_read_from_proc():
    shell = subprocess.Popen(["bash", "-c", "sleep 30 & (sleep 30 & wait) & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(proctree.descendants(shell.pid) or []) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(proctree.descendants(shell.pid)) == 3
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)])
        shell.kill()


def test_a_frozen_worker_has_every_thread_stopped_and_runs_again_after(tmp_path, monkeypatch):
    # Four threads spinning in the worker's tree: the block is entered only once each is
    # stopped, and every one runs again after it.
    with sandbox.Sandbox(tmp_path / "w.log", sandbox.child_env({}), memory_bytes=8 << 30,
                         log_bytes=1 << 20) as box:
        spinner = subprocess.Popen([sys.executable, "-c", _SPIN])
        try:
            time.sleep(0.5)
            assert not proctree.stopped(spinner.pid)
            monkeypatch.setattr(box, "_tree", lambda: [psutil.Process(spinner.pid)])  # its own
            _stopped_only_while_frozen(box, spinner.pid)
        finally:
            spinner.kill()


def test_a_stray_that_cleared_its_environment_is_stopped_with_the_worker(tmp_path):
    # Forked twice (its parent exits, so kbench, the child subreaper, adopts it), in a session
    # of its own and with an empty environment: nothing marks it, yet it is stopped.
    with _box(tmp_path) as box:
        stray = _stray(tmp_path, "[None for _ in iter(int, 1)]")
        try:
            assert not stray.environ()
            _stopped_only_while_frozen(box, stray.pid)
        finally:
            stray.kill()
            stray.wait(5)


def test_a_stray_s_busy_child_is_stopped_and_every_stray_dies_with_the_worker(tmp_path):
    # The adopted stray sleeps while a child of its own, with an empty environment too,
    # burns the CPU: the child is not kbench's, yet it is stopped while the reference is
    # timed, and neither outlives the worker.
    pidfile, script = tmp_path / "burner.pid", tmp_path / "burner.py"
    script.write_text(f"import os\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                      "[None for _ in iter(int, 1)]\n")
    with _box(tmp_path) as box:
        stray = _stray(tmp_path, "import subprocess, sys\n"
                       f"subprocess.Popen([sys.executable, {str(script)!r}], env={{}}).wait()")
        burner = psutil.Process(_read_pid(pidfile))
        try:
            assert burner.ppid() == stray.pid and not burner.environ()
            _stopped_only_while_frozen(box, burner.pid)
        finally:
            box.close()
            assert not stray.is_running() and not burner.is_running()


def test_a_worker_that_cannot_be_stopped_is_killed_not_left_running(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "_STOP_WAIT_S", 0.2)
    monkeypatch.setattr(proctree, "stopped", lambda pid: False)  # a thread that never stops
    with _box(tmp_path) as box:
        with pytest.raises(sandbox.SandboxFailure, match="did not all stop"):
            with box.frozen():
                raise AssertionError("entered while a thread still ran")
        assert box.proc.poll() is not None


def _box(tmp_path) -> sandbox.Sandbox:
    return sandbox.Sandbox(tmp_path / "w.log", sandbox.child_env({}), memory_bytes=8 << 30,
                           log_bytes=1 << 20)


def _stray(tmp_path, code: str) -> psutil.Process:
    """A process that leaves the tree (setsid, its parent exits: adopted here) with an empty
    environment, running ``code`` after writing its pid."""
    pidfile = tmp_path / "stray.pid"
    script = tmp_path / "stray.py"
    script.write_text(f"import os\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n{code}\n")
    subprocess.run(["bash", "-c", f"setsid env -i {sys.executable} {script} & disown"],
                   check=True)
    stray = psutil.Process(_read_pid(pidfile))
    deadline = time.monotonic() + 10
    while stray.ppid() != psutil.Process().pid:  # adopted once bash has exited
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return stray


def _read_pid(path) -> int:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return int(path.read_text())


def _stopped_only_while_frozen(box: sandbox.Sandbox, pid: int) -> None:
    with box.frozen():
        assert proctree.stopped(pid)
    time.sleep(0.2)
    assert not proctree.stopped(pid)
