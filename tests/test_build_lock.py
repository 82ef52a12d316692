"""Build folders kbench owns (kbench.host.build_lock): one builder at a time, whatever process it
is in, and what a dead build left cleared before the next one starts."""

import fcntl
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from kbench.host import build_lock


def _torch_build(folder: Path, logged: list[str], unlogged: list[str]) -> Path:
    """A torch extension's build folder as ninja leaves it: what its log records as finished,
    and outputs it never recorded (a compiler or linker killed mid-write)."""
    build = folder / "ext"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text("# ninja file\n")
    lines = ["# ninja log v7"] + [f"0\t10\t1\t{name}\tabc" for name in logged]
    (build / ".ninja_log").write_text("\n".join(lines) + "\n")
    for name in logged + unlogged:
        (build / name).write_bytes(b"\x7fELF")
    return build


def test_outputs_ninja_never_finished_go_and_finished_ones_stay(tmp_path):
    build = _torch_build(tmp_path, ["main.o"], ["cuda.cuda.o", "ext.so"])
    (build / "main.cpp").write_text("int x;")
    done = build_lock.clear(tmp_path)
    assert sorted(p.name for p in build.iterdir()) == [".ninja_log", "build.ninja", "main.cpp",
                                                        "main.o"]
    assert any("2 output(s) ninja never finished" in line for line in done)
    assert build_lock.clear(tmp_path) == []  # nothing left to clear


def _hold(path: Path, ready, lock_kind: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    if lock_kind == "kbench":
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(120)


def _holder(path: Path, kind: str) -> multiprocessing.Process:
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold, args=(path, ready, kind), daemon=True)
    proc.start()
    assert ready.wait(30)
    return proc


def test_a_folder_another_process_builds_is_busy_until_that_process_dies(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    other = _holder(tmp_path / build_lock.LOCK_NAME, "kbench")
    with pytest.raises(build_lock.Busy, match=f"pid {other.pid}"):
        with build_lock.held(tmp_path, wait_s=0.3):
            pass
    os.kill(other.pid, signal.SIGKILL)  # the kernel drops its lock, however it died
    other.join()
    with build_lock.held(tmp_path, wait_s=5) as cleared:
        assert cleared == []


def test_torch_s_lock_file_goes_only_where_the_file_itself_blocks_and_nobody_holds_it(
        tmp_path, monkeypatch):
    build = _torch_build(tmp_path, [], [])
    lock = build / "lock"
    lock.touch()
    monkeypatch.setattr(build_lock, "_existence_blocks", lambda: False)  # torch 2.14 and later
    build_lock.clear(tmp_path)
    assert lock.exists()
    monkeypatch.setattr(build_lock, "_existence_blocks", lambda: True)  # torch up to 2.13
    live = _holder(lock, "torch")  # a live torch holds an OS lock on it while it builds
    try:
        build_lock.clear(tmp_path)
        assert lock.exists()
    finally:
        os.kill(live.pid, signal.SIGKILL)
        live.join()
    done = build_lock.clear(tmp_path)
    assert not lock.exists()
    assert any("removed torch's lock" in line for line in done)
