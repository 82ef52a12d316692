"""Reading process trees (kbench.host.proctree), and stopping a worker whole (Sandbox.frozen)."""

import subprocess
import sys
import time

import psutil

from kbench import sandbox
from kbench.host import proctree, spawn

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
    # of its own and with an empty environment: no mark to find it by, yet it is stopped.
    with sandbox.Sandbox(tmp_path / "w.log", sandbox.child_env({}), memory_bytes=8 << 30,
                         log_bytes=1 << 20) as box:
        pidfile = tmp_path / "stray.pid"
        subprocess.run(["bash", "-c", f"setsid env -i {sys.executable} -c "
                        f"'import os; open(\"{pidfile}\", \"w\").write(str(os.getpid())); "
                        "[None for _ in iter(int, 1)]' & disown"], check=True)
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stray = psutil.Process(int(pidfile.read_text()))
        try:
            while stray.ppid() != psutil.Process().pid:  # adopted once bash has exited
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert "KBENCH_SANDBOX_MARK" not in stray.environ()
            _stopped_only_while_frozen(box, stray.pid)
        finally:
            stray.kill()
            stray.wait(5)


def _stopped_only_while_frozen(box: sandbox.Sandbox, pid: int) -> None:
    with box.frozen():
        assert proctree.stopped(pid)
    time.sleep(0.2)
    assert not proctree.stopped(pid)


def test_frozen_leaves_kbench_s_own_children_running_and_stops_strays_whatever_their_mark(
        tmp_path):
    # Started after the worker, children of this process and in no `own` set: a compiler
    # kbench runs itself (in kbench's session) is left running; an orphan in a session of its
    # own is stopped even where its environment names another worker (a mark can be forged).
    with sandbox.Sandbox(tmp_path / "w.log", sandbox.child_env({}), memory_bytes=8 << 30,
                         log_bytes=1 << 20) as box:
        mine = subprocess.Popen([sys.executable, "-c", _SPIN])
        forged = subprocess.Popen([sys.executable, "-c", _SPIN], start_new_session=True,
                                  env={**sandbox.child_env({}), proctree.MARK: "another"})
        try:
            time.sleep(0.5)
            with spawn.settled() as kbench_s:
                assert [p.pid for p in proctree.strays(box.started, kbench_s)] == [forged.pid]
            with box.frozen():
                assert not proctree.stopped(mine.pid) and proctree.stopped(forged.pid)
        finally:
            for proc in (mine, forged):
                proc.kill()
                proc.wait(5)


def test_time_a_worker_spends_stopped_by_kbench_is_not_counted_against_its_request(tmp_path):
    # An import of 1 s answered within a 2.5 s limit although kbench held the worker stopped
    # for 3 s of it (the torch.compile baseline readied beside a timing is stopped so).
    import threading

    from kbench.shared import protocol

    reference, slow = tmp_path / "reference.py", tmp_path / "slow.py"
    reference.write_text("X = 1\n")
    slow.write_text("import time\ntime.sleep(1.0)\nclass ModelNew:\n    pass\n")
    with sandbox.Sandbox(tmp_path / "w.log", sandbox.child_env({}), memory_bytes=8 << 30,
                         log_bytes=1 << 20) as box:
        box.request(protocol.Load(path=str(reference), module_name="warm", class_name="X",
                                  device="cpu", reference=str(reference), model=None,
                                  eval_mode=True, compile=False, shared_names=False), 120)

        def stop_a_while() -> None:
            time.sleep(0.3)
            with box.frozen():
                time.sleep(3.0)

        stopper = threading.Thread(target=stop_a_while)
        start = time.monotonic()
        stopper.start()
        answer = box.request(protocol.Load(
            path=str(slow), module_name="slow", class_name="ModelNew", device="cpu",
            reference=str(reference), model=None, eval_mode=True, compile=False,
            shared_names=False), 2.5)
        stopper.join()
        assert time.monotonic() - start > 3.0
        assert protocol.decode(answer, protocol.Load.answers).__class__.__name__ == "Loaded"
