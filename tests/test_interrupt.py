"""A stopped batch resumes: build folders kbench owns (a dead build's torch lock, under torch's
FileBaton behaviour up to 2.13, never stalls a later build), kbench's own stop (Ctrl-C,
SIGTERM) never a submission's verdict, and nothing left running after a stop or a kill -9."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES, ROOT, by_name, fresh_cache, quick_task

from kbench import sandbox
from kbench.host import proctree
from kbench.results.store import Store

# A real load_inline build of C++ that includes pybind11 alone: about 5 s of compiler CPU time, long
# enough to be stopped mid-way 2 s in, where torch/extension.h costs some 30 s each time it builds.
CPP = FIXTURES / "interrupt_cpp_ok.py"
SLOW = FIXTURES / "slow" / "l2norm_slow_a.py"
BATON = FIXTURES / "file_baton"  # sitecustomize: torch's lock as it was up to 2.13


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    """Two submissions, one with a C++ build, and a task whose build limit a stalled build
    would run into (so that the old behaviour fails in minutes, not hours)."""
    folder = tmp_path_factory.mktemp("batch")
    subs = folder / "subs"
    subs.mkdir()
    for source in (CPP, SLOW):
        (subs / source.name).write_bytes(source.read_bytes())
    quick_task(folder, **{"limits.build_s": 150})
    return folder


def _start(batch: Path, out: Path, cache: Path, *extra: str) -> subprocess.Popen:
    """``kbench grade`` of the batch in a session of its own, with torch's FileBaton lock."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BATON), str(ROOT)])}
    args = ["grade", str(batch / "subs"), "--task", str(batch / "task" / "l2norm.yaml"),
            "--out", str(out), "--cache-dir", str(cache), "--jobs", "1", "--no-timing",
            "--seed", "11", *extra]
    return subprocess.Popen([sys.executable, "-m", "kbench", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _compiling(cache: Path, timeout: float = 120) -> None:
    """Wait until a compiler runs on a source in ``cache``'s build folders."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for proc in psutil.process_iter(["name", "cmdline"]):
            if proc.info["name"] in ("cc1plus", "c++", "g++") and \
                    str(cache) in " ".join(proc.info["cmdline"] or []):
                time.sleep(2.0)  # well into the compile
                return
        time.sleep(0.1)
    raise AssertionError("no compiler was seen building")


def _verdicts(out: Path) -> dict[str, tuple]:
    results = json.loads((out / "results.json").read_text())
    return {n: (s["status"], s["reason"], s["cases_passed"]) for n, s in by_name(results).items()}


def _owned_by(pid: int) -> list[psutil.Process]:
    """Processes that kbench process ``pid`` started, however far down, found by the owner
    each carries in its environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(proctree.OWNER, "").startswith(f"{pid}:"):
                found.append(proc)
        except psutil.Error:
            continue
    return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _build_folder(cache: Path) -> Path:
    (folder,) = (cache / "extensions").glob("*/l2norm_cpp")
    return folder


@pytest.fixture(scope="module")
def whole(batch, tmp_path_factory, compile_checked) -> tuple[dict[str, tuple], Path]:
    """The batch graded without a stop, under the same seed, in a cache of its own: its
    verdicts, and that cache (built)."""
    out = tmp_path_factory.mktemp("whole")
    proc = _start(batch, out / "out", fresh_cache(out / "cache", compile_checked))
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output
    assert "FileBaton: holding" in (out / "out" / "logs" / f"{CPP.stem}.build.log").read_text()
    verdicts = _verdicts(out / "out")
    assert [v[0] for v in verdicts.values()] == ["ok", "ok"], output
    return verdicts, out / "cache"


@pytest.fixture
def uninterrupted(whole) -> dict[str, tuple]:
    return whole[0]


@pytest.fixture
def built(whole, tmp_path) -> Iterator[Path]:
    """``whole``'s cache, built, where it was built (torch's build.ninja names its folder, so
    a copy elsewhere compiles again), put back as it was after the test."""
    cache = whole[1]
    kept = tmp_path / "built"
    shutil.copytree(cache, kept, symlinks=True)
    yield cache
    shutil.rmtree(cache)
    kept.rename(cache)


def test_kill_9_mid_build_leaves_a_stale_torch_lock_that_resume_clears(batch, tmp_path,
                                                                       uninterrupted,
                                                                       compile_checked):
    out, cache = tmp_path / "out", fresh_cache(tmp_path / "cache", compile_checked)
    proc = _start(batch, out, cache)
    _compiling(cache)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (_build_folder(cache) / "lock").exists()  # torch's lock, as a killed build leaves it

    resumed = _start(batch, out, cache, "--resume")
    output = resumed.communicate(timeout=400)[0]
    assert resumed.returncode == 0, output
    assert "removed torch's lock left by an interrupted build" in output
    assert _verdicts(out) == uninterrupted
    assert not _owned_by(proc.pid)
    assert Store(out).unfinished_run("l2norm") is None


def test_a_stale_lock_in_a_built_folder_is_cleared_and_the_build_loads(batch, tmp_path,
                                                                      whole, built):
    out, cache = tmp_path / "out", built  # built, as a finished run leaves it
    lock = _build_folder(cache) / "lock"
    lock.unlink(missing_ok=True)
    lock.touch()  # a loader killed after its build finished left its lock (as torch <= 2.13)
    again = _start(batch, out, cache)
    output = again.communicate(timeout=400)[0]
    assert again.returncode == 0, output
    assert "removed torch's lock" in output
    assert "ninja: no work to do" in (out / "logs" / f"{CPP.stem}.build.log").read_text()
    assert _verdicts(out) == whole[0]


def test_sigint_during_builds_stops_everything_and_the_printed_resume_works(batch, tmp_path,
                                                                           uninterrupted,
                                                                           compile_checked):
    out, cache = tmp_path / "out", fresh_cache(tmp_path / "cache", compile_checked)
    proc = _start(batch, out, cache)
    _compiling(cache)
    started = [p for p in psutil.Process(proc.pid).children(recursive=True)]
    assert started
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    psutil.wait_procs(started, timeout=max(0.0, 10 - (time.monotonic() - sent)))
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not _owned_by(proc.pid)
    assert proc.returncode == 128 + signal.SIGINT, output
    store = Store(out)
    run = store.unfinished_run("l2norm")
    assert run is not None  # left for --resume, with nothing blamed on the build it stopped
    assert not [r for r in store.load_run(run.id).submissions
                if r.status.value in ("build_error", "timeout", "infrastructure_error",
                                      "crashed", "internal_error")]
    store.close()
    command = next(line.strip() for line in output.splitlines()
                   if line.strip().startswith("kbench grade ") and "--resume" in line)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BATON), str(ROOT)])}
    again = subprocess.run([sys.executable, "-m", *shlex.split(command)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _verdicts(out) == uninterrupted


def test_sigterm_while_slots_grade_stores_no_verdict_for_what_it_stopped(batch, tmp_path,
                                                                         whole, built):
    out, cache = tmp_path / "out", built  # built: the stop comes while a slot grades, not builds
    proc = _start(batch, out, cache, "--slots", "2")
    end = time.monotonic() + 300
    while not (out / "logs" / f"{SLOW.stem}.run.log").exists():  # a slot is grading
        assert time.monotonic() < end and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output
    time.sleep(1.0)
    assert not _owned_by(proc.pid)
    store = Store(out)
    run = store.unfinished_run("l2norm")
    assert run is not None
    statuses = {r.name: r.status.value for r in store.load_run(run.id).submissions}
    store.close()
    assert all(s == "ok" for s in statuses.values()), statuses  # only what finished, as it was
    resumed = _start(batch, out, cache, "--slots", "2", "--resume")
    assert resumed.communicate(timeout=400)[0] and resumed.returncode == 0
    assert _verdicts(out) == whole[0]


def test_a_reaped_worker_s_pid_is_never_signalled_again(tmp_path):
    """Linux reuses pids (32768 of them by default): once a worker is reaped, its pid, and the
    process group it named, may be another run's process. A kbench process that signalled it
    then (a kill, a SIGSTOP while timing) stopped or killed another suite's workers."""
    box = sandbox.Sandbox(tmp_path / "w.log", sandbox.child_env({}), memory_bytes=4 << 30,
                          log_bytes=1 << 20)
    box.close()
    assert box.proc.returncode is not None  # reaped
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        box.proc.pid = other.pid  # the pid given to a new session leader, as reuse would
        box.kill()
        assert other.pid not in [p.pid for p in box._tree()]  # what frozen() would stop
        with pytest.raises(subprocess.TimeoutExpired):  # alive
            other.wait(timeout=2)
    finally:
        other.kill()
        other.wait()


def test_a_stop_while_the_reports_are_written_keeps_the_finished_run(tmp_path, monkeypatch,
                                                                     capsys, compile_checked):
    from kbench.cli import commands, grade_command
    from kbench.host import interrupt

    def stopped(*args, **kwargs):
        raise interrupt.Interrupted(signal.SIGINT)

    monkeypatch.setattr(grade_command, "render", stopped)
    task = quick_task(tmp_path)
    code = commands.main(["grade", str(FIXTURES / "cpu" / "l2norm_torch_ok.py"), "--task",
                          str(task), "--device", "cpu", "--no-timing", "--out",
                          str(tmp_path / "out"), "--cache-dir",
                          str(fresh_cache(tmp_path / "cache", compile_checked))])
    assert code == 128 + signal.SIGINT
    assert "is finished and stored: `kbench report --out" in capsys.readouterr().err
    store = Store(tmp_path / "out")
    assert store.unfinished_run("l2norm") is None  # whole: nothing for --resume to do
    assert [r.status.value for r in store.load_run(1).submissions] == ["ok"]
    store.close()
