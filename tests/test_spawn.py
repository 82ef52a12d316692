"""Workers forked from a zygote (kbench.host.spawn, kbench.worker.zygote): each one is what a
started ``python -m kbench.worker`` is, for kbench and for the submission in it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES

from kbench import sandbox
from kbench.host import proctree, spawn
from kbench.shared import protocol

pytestmark = pytest.mark.skipif(not spawn.FORK, reason="forked workers need Linux")

_SHOWS = """import os, sys, torch
print("var", os.environ.get("KBENCH_TEST_VAR"), "cwd", os.getcwd(), "argv", len(sys.argv),
      "stdin", os.read(0, 1), "cuda refused", torch._C._cuda_isInBadFork(), flush=True)

class ModelNew:
    pass
"""
_REFERENCE = "import torch\nclass Model(torch.nn.Module):\n    pass\n" \
             "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"


def _box(log: Path, env: dict[str, str]) -> sandbox.Sandbox:
    return sandbox.Sandbox(log, env, memory_bytes=8 << 30, log_bytes=1 << 20)


def _forked(tmp_path: Path, env: dict[str, str]) -> sandbox.Sandbox:
    """A sandbox whose worker came from the zygote for ``env`` (started now where there is
    none: wait until it is ready)."""
    spawn.warm(env)
    deadline = time.monotonic() + 120
    while not spawn.ready(env):
        assert time.monotonic() < deadline, "the zygote never became ready"
        time.sleep(0.1)
    box = _box(tmp_path / "forked.log", env)
    assert isinstance(box.proc, spawn.Adopted)
    return box


def _load(box: sandbox.Sandbox, path: Path, reference: Path) -> object:
    return box.request(protocol.Load(path=str(path), module_name="kbench_submission_x",
                                     class_name="ModelNew", device="cpu",
                                     reference=str(reference), model=None), 60)


def test_a_forked_worker_is_a_started_worker_for_kbench_and_the_submission(tmp_path):
    env = sandbox.child_env({"KBENCH_TEST_VAR": "first"})
    sub, ref = tmp_path / "shows.py", tmp_path / "ref.py"
    sub.write_text(_SHOWS)
    ref.write_text(_REFERENCE)
    box = _forked(tmp_path, env)
    started = time.monotonic()
    # Another worker of the same kind but its own build folder: the same zygote, at once.
    other = _box(tmp_path / "other.log", {**env, "TORCH_EXTENSIONS_DIR": str(tmp_path / "b")})
    assert isinstance(other.proc, spawn.Adopted) and time.monotonic() - started < 10
    other.close()
    with box:
        proc = psutil.Process(box.proc.pid)
        assert proc.ppid() == os.getpid()  # adopted: kbench waits for it
        assert os.getsid(proc.pid) == proc.pid == os.getpgid(proc.pid)  # its own session
        assert proc.cpu_affinity() == sorted(os.sched_getaffinity(0))
        assert isinstance(protocol.decode(_load(box, sub, ref), protocol.Load.answers),
                          protocol.Loaded)
        log = box.log_text()
        # CUDA as a new process has it: nothing the zygote imported asked for the devices.
        assert f"var first cwd {box.scratch} argv 4 stdin b'' cuda refused False" in log, log
    assert box.proc.returncode == 0  # asked to exit, it did: its status read here
    killed = _forked(tmp_path, env)
    killed.kill()
    assert killed.proc.returncode == -signal.SIGKILL


def test_another_environment_gets_a_zygote_of_its_own(tmp_path):
    env = sandbox.child_env({"KBENCH_TEST_VAR": "a"})
    _forked(tmp_path, env).close()
    box = _box(tmp_path / "b.log", sandbox.child_env({"KBENCH_TEST_VAR": "b"}))
    assert isinstance(box.proc, __import__("subprocess").Popen)  # its zygote is not ready yet
    box.close()


def test_a_daemon_a_forked_worker_leaves_without_exec_is_stopped_and_killed(tmp_path):
    # The stray fixture forks twice and leaves its session at import, never executing: Linux
    # shows it the zygote's environment, so it carries the zygote's mark, not the worker's.
    pids = tmp_path / "pids"
    env = sandbox.child_env({"STRAY_PIDS": str(pids)})
    ref = tmp_path / "ref.py"
    ref.write_text(_REFERENCE)
    box = _forked(tmp_path, env)
    with box:
        _load(box, FIXTURES / "stray" / "l2norm_leaves_daemon.py", ref)
        deadline = time.monotonic() + 20
        while not pids.exists() or not pids.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        daemon = psutil.Process(int(pids.read_text().split()[0]))
        while daemon.ppid() != os.getpid():  # adopted here once its parent has exited
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert daemon.environ().get(proctree.MARK) not in (None, box.marks[0])
        with box.frozen():
            assert proctree.stopped(daemon.pid)
    with pytest.raises(psutil.NoSuchProcess):
        daemon.wait(10)
        daemon.status()


def test_a_sibling_forked_while_another_worker_is_swept_lives(tmp_path):
    # Each forked worker shows the zygote's mark, as do the escapees of its siblings, which a
    # sibling's kill sweeps: one forked meanwhile must not be taken for one of them.
    env = sandbox.child_env({"KBENCH_TEST_VAR": "siblings"})
    sub, ref = tmp_path / "sub.py", tmp_path / "ref.py"
    sub.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    ref.write_text(_REFERENCE)
    swept = _forked(tmp_path, env)
    swept.kill()
    done = threading.Event()
    sweeper = threading.Thread(target=lambda: [swept.kill() for _ in iter(done.is_set, True)])
    sweeper.start()
    try:
        for i in range(12):
            with _box(tmp_path / f"s{i}.log", env) as box:
                assert isinstance(box.proc, spawn.Adopted)
                _load(box, sub, ref)  # raises where it was killed
    finally:
        done.set()
        sweeper.join()
        swept.close()


def test_plain_starts_where_the_zygote_is_turned_off(tmp_path, monkeypatch):
    monkeypatch.setattr(spawn, "FORK", False)
    with _box(tmp_path / "w.log", sandbox.child_env({})) as box:
        assert box.proc.args[:3] == [sys.executable, "-m", "kbench.worker"]


def test_a_worker_stopped_mid_request_by_another_is_continued(tmp_path):
    # A submission may stop every kbench worker (tests/fixtures/cpu/l2norm_stops_reference.py)
    # and end before it continues them: the one kbench waits on answers all the same.
    sub, ref = tmp_path / "slow.py", tmp_path / "ref.py"
    sub.write_text("import time\ntime.sleep(1.0)\n\nclass ModelNew:\n    pass\n")
    ref.write_text(_REFERENCE)
    with _box(tmp_path / "w.log", sandbox.child_env({})) as box:
        stopper = __import__("threading").Timer(
            0.3, lambda: os.killpg(box.proc.pid, signal.SIGSTOP))
        stopper.start()
        started = time.monotonic()
        answer = protocol.decode(_load(box, sub, ref), protocol.Load.answers)
        assert isinstance(answer, protocol.Loaded) and time.monotonic() - started < 30


def test_a_worker_readied_ahead_stays_stopped_while_frozen_mid_request(tmp_path):
    # Its thread waits on a request of its own, continuing the worker now and then (another
    # may have stopped it): not while kbench holds it stopped (the reference being timed).
    from types import SimpleNamespace

    from kbench.grading.channel import Ahead
    from kbench.grading.context import Spare

    ticks, ref = tmp_path / "ticks", tmp_path / "ref.py"
    ref.write_text(_REFERENCE)
    sub = tmp_path / "ticking.py"
    sub.write_text(f"import time\nwith open({str(ticks)!r}, 'a') as f:\n"
                   "    for _ in range(400):\n        f.write('.'); f.flush(); time.sleep(0.01)\n"
                   "class ModelNew:\n    pass\n")
    ctx = SimpleNamespace(task=SimpleNamespace(limits=SimpleNamespace(
        host_memory_gib=8, log_mib=1, load_s=60)), logs=tmp_path,
        spare=Spare(tuple(sorted(os.sched_getaffinity(0))), 5))
    ahead = Ahead(ctx, "ahead.log", sandbox.child_env({}),
                  [lambda channel: _load(channel.box, sub, ref)])
    try:
        deadline = time.monotonic() + 30
        while not ticks.exists() or not ticks.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with ahead.channel.frozen():
            time.sleep(0.3)  # any continue by the waiting thread shows within 50 ms
            before = len(ticks.read_text())
            time.sleep(0.6)
            assert len(ticks.read_text()) == before
        ahead.take()
    finally:
        ahead.close()


def test_a_forked_worker_never_waits_out_its_adoption(tmp_path):
    # The worker waits for the middle process of its double fork to exit (then kbench has
    # adopted it). It named that process by asking for its parent, after the fork: where the
    # middle process had exited already, that named kbench, and the worker waited the whole
    # _ADOPTED_S (5 s) before its first answer, one start in three on a 2-core machine.
    from kbench.worker import zygote

    env = sandbox.child_env({"KBENCH_TEST_VAR": "adopted"})
    sub, ref = tmp_path / "shows.py", tmp_path / "ref.py"
    sub.write_text(_SHOWS)
    ref.write_text(_REFERENCE)
    _forked(tmp_path, env).close()  # its zygote ready
    took = []
    for k in range(10):
        started = time.monotonic()
        with _box(tmp_path / f"w{k}.log", env) as box:
            assert isinstance(box.proc, spawn.Adopted)
            _load(box, sub, ref)
            took.append(time.monotonic() - started)
    assert max(took) < zygote._ADOPTED_S - 1.0, [round(t, 2) for t in took]
