"""The results store: resume after kill -9, concurrent graders, reuse, history, bad files."""

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES, ROOT, by_name, fresh_cache, grade, quick_task

from kbench.cli import commands as cli
from kbench.grading.options import Options
from kbench.reports import report_folder
from kbench.results.presence import LOCK_NAME
from kbench.results.store import FILENAME, OPENING_LOCK, Store

SLOW = FIXTURES / "slow"
EXPECTED = {"l2norm_slow_a": "ok", "l2norm_slow_b": "wrong_output", "l2norm_slow_c": "ok",
            "l2norm_slow_d": "runtime_error"}
# What these tests check is the store, not the stopwatch: where no speedup is looked at, runs
# grade correctness only (the slow fixtures' timed calls sleep too).
UNTIMED = "--no-timing"


@pytest.fixture
def task(tmp_path):
    return quick_task(tmp_path)


def start(args: list[str], out: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "kbench", "grade", *args, "--out", str(out),
                             "--cache-dir", str(cache), "--jobs", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stored(out: Path) -> tuple[int, int]:
    """(runs, results) in the store, read without disturbing the writer."""
    path = out / FILENAME
    if not path.exists():
        return 0, 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            runs = db.execute("SELECT count(*) FROM runs").fetchone()[0]
            results = db.execute("SELECT count(*) FROM results").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:  # the store is being created
        return 0, 0
    return runs, results


def wait_for(condition, timeout: float = 180.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.05)


def workers_of(pid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "kbench.worker" in cmd and cmd[-1] == str(pid):
            found.append(proc)
    return found


def _kill_while_writing(proc: subprocess.Popen, out: Path) -> None:
    """Kill -9 the grader in the middle of a store write: the test holds the store's write
    lock from the first result on, so the grader's write of the next result waits inside
    its transaction (its log, renamed into place as its worker closes, says it is there)."""
    wait_for(lambda: stored(out)[1] >= 1)
    holder = sqlite3.connect(out / FILENAME, isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")
    try:
        first = {p.name for p in (out / "logs").glob("*.run.log")}
        wait_for(lambda: {p.name for p in (out / "logs").glob("*.run.log")} - first)
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.parametrize("kill_after", [0, 2, "store write"])
def test_resume_after_kill_minus_9(tmp_path, task, cache_dir, kill_after):
    out = tmp_path / "out"
    proc = start([str(SLOW), "--task", str(task), "--seed", "99", UNTIMED], out, cache_dir)
    if kill_after == 0:
        wait_for(lambda: stored(out)[0] == 1)
        time.sleep(1.0)  # mid-build
    elif kill_after == "store write":
        _kill_while_writing(proc, out)
    else:
        wait_for(lambda: stored(out)[1] >= kill_after)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert stored(out)[1] < len(EXPECTED)
    wait_for(lambda: not workers_of(proc.pid), timeout=30)  # its workers died with it

    done = stored(out)[1]
    resumed = start([str(SLOW), "--task", str(task), "--resume"], out, cache_dir)
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output
    assert "seed 99, timing off, resuming run 1" in output  # the stored options, not defaults
    assert output.count("] l2norm_slow_") == len(EXPECTED) - done  # only what was missing
    left = len(EXPECTED) - done
    assert f"[{left}/{left}] l2norm_slow_" in output  # progress counts what was left
    assert done == 0 or f"has {done} result(s) stored; grading the other {left}" in output
    results = json.loads((out / "results.json").read_text())
    assert results["run_id"] == 1 and results["seed"] == 99
    assert {n: s["status"] for n, s in by_name(results).items()} == EXPECTED
    store = Store(out)
    assert store.unfinished_run("l2norm") is None and store.latest_run_id() == 1
    assert not list((out / "logs").glob(".*"))  # no half-written log left behind


def test_two_graders_on_one_folder(tmp_path, task, cache_dir):
    out = tmp_path / "out"
    procs = [start([str(SLOW), "--task", str(task), "--seed", str(s), UNTIMED], out, cache_dir)
             for s in (1, 2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    store = Store(out)
    for run_id in (1, 2):
        run = store.load_run(run_id)
        assert {s.name: s.status.value for s in run.submissions} == EXPECTED
    assert store.unfinished_run("l2norm") is None
    results = json.loads((out / "results.json").read_text())
    assert results["run_id"] in (1, 2) and len(results["submissions"]) == len(EXPECTED)
    assert not list((out / "logs").glob(".*"))


def _open_write_close(folder: Path, barrier, errors) -> None:
    barrier.wait()
    try:
        for _ in range(3):
            store = Store(folder)
            store.finish_run(store.start_run(
                kbench_version="0", task="t", task_hash="h", seed=1, device="cpu",
                fingerprint="f", options={}, environment={}))
            store.close()
    except Exception as exc:  # noqa: BLE001 - the parent reports whatever went wrong
        errors.put(repr(exc))


def test_processes_opening_one_store_together_all_get_it(tmp_path):
    """SQLite refuses at once, not after its busy timeout, a second process switching a new
    store to WAL; kbench's processes must still all get the store (a CI failure once)."""
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for trial in range(25):
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_write_close, args=(tmp_path / str(trial), barrier,
                                                              errors)) for _ in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(60)
        assert [proc.exitcode for proc in procs] == [0] * 4
        assert errors.empty(), errors.get()
        store = Store(tmp_path / str(trial))
        assert store.db.execute("SELECT count(*) FROM runs").fetchone()[0] == 12
        store.close()


def test_a_second_resume_of_a_run_being_graded_is_refused(tmp_path, task, cache_dir):
    out = tmp_path / "out"
    first = start([str(SLOW), "--task", str(task), "--seed", "7"], out, cache_dir)
    wait_for(lambda: stored(out)[1] >= 1)
    second = start([str(SLOW), "--task", str(task), "--resume"], out, cache_dir)
    said = second.communicate(timeout=120)[0]
    assert second.returncode == 2, said
    assert "run 1" in said and f"being graded by another kbench process (pid {first.pid})" in said
    assert first.communicate(timeout=300)[0] and first.returncode == 0
    assert {s.name: s.status.value for s in Store(out).load_run(1).submissions} == EXPECTED


def test_prune_keeps_the_newest_runs_and_what_they_use(tmp_path, task, capsys,
                                                        compile_checked):
    out, cache = tmp_path / "out", fresh_cache(tmp_path / "cache", compile_checked)
    args = [str(SLOW / "l2norm_slow_b.py"), "--task", str(task), "--force", UNTIMED]
    old_build = cache / "extensions" / "l2norm_gone-0123"
    old_build.mkdir(parents=True)
    (old_build / "x.so").write_bytes(b"\0" * 4096)
    os.utime(old_build, (1, 1))  # last used long before any run
    stale_log = out / "logs" / "l2norm_renamed.run.log"
    stale_log.parent.mkdir(parents=True)
    stale_log.write_text("from a submission no run names any more")
    os.utime(stale_log, (1, 1))
    for _ in range(3):
        assert grade(args, out, cache)[0] == 0
    used = [p for p in (cache / "extensions").iterdir() if p != old_build]
    capsys.readouterr()
    assert cli.main(["prune", "--keep", "1", "--out", str(out), "--cache-dir", str(cache)]) == 0
    said = capsys.readouterr().out
    assert "deleted 2 run(s) (runs 1-2) and 1 log file(s)" in said, said
    assert "deleted 1 build folder(s)" in said
    store = Store(out)
    assert store.latest_run_id() == 3 and [r["run"] for r in store.history("l2norm_slow_b")] == [3]
    assert not old_build.exists() and not stale_log.exists()
    assert all(p.exists() for p in used)
    assert (out / "logs" / "l2norm_slow_b.run.log").exists()  # run 3 names it
    assert cli.main(["report", "--out", str(out)]) == 0


def test_unchanged_file_reused_changed_one_regraded(tmp_path, task, cache_dir):
    out = tmp_path / "out"
    src = tmp_path / "l2norm_torch_ok.py"  # graded five times: a quick one
    src.write_text((FIXTURES / "cpu" / "l2norm_torch_ok.py").read_text())
    quick = ["--profile", "quick"]  # timed (speedups are compared), but briefly
    args = [str(src), "--task", str(task), *quick]
    first = grade(args, out, cache_dir)[1]["submissions"][0]
    assert first["status"] == "ok" and first["reused_from_run"] is None

    again = grade(args, out, cache_dir)[1]["submissions"][0]
    assert again["reused_from_run"] == 1 and again["speedup"] == first["speedup"]
    assert "reused from run 1" in (out / "leaderboard.md").read_text()

    forced = grade([*args, "--force"], out, cache_dir)[1]["submissions"][0]
    assert forced["reused_from_run"] is None

    src.write_text(src.read_text() + "\n# edited\n")
    edited = grade(args, out, cache_dir)[1]["submissions"][0]
    assert edited["reused_from_run"] is None and edited["sha256"] != first["sha256"]

    other_task = quick_task(tmp_path / "t2", **{"correctness.random_cases": 4})
    changed = grade([str(src), "--task", str(other_task), *quick], out,
                    cache_dir)[1]["submissions"][0]
    assert changed["reused_from_run"] is None


def test_history_and_report_from_the_store(tmp_path, task, cache_dir, capsys):
    out = tmp_path / "out"
    args = [str(SLOW / "l2norm_slow_b.py"), "--task", str(task)]  # timed: the second reuses
    grade(args, out, cache_dir)
    grade(args, out, cache_dir)
    before = json.loads((out / "results.json").read_text())
    (out / "results.json").unlink()
    (out / "leaderboard.md").unlink()
    capsys.readouterr()
    assert cli.main(["report", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text()) == before
    assert (out / "leaderboard.md").exists()
    assert cli.main(["report", "--out", str(out), "--run", "1"]) == 0
    assert json.loads((out / "results.json").read_text())["run_id"] == 1

    capsys.readouterr()
    assert cli.main(["history", "l2norm_slow_b", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.count("wrong_output") == 2 and "run 1" in table
    assert cli.main(["history", "l2norm_nobody", "--out", str(out)]) == 2


@pytest.mark.parametrize("content", [b"this is not a database\n" * 50, "foreign"])
def test_corrupt_or_foreign_store_refused_and_untouched(tmp_path, task, cache_dir, capsys,
                                                        content):
    out = tmp_path / "out"
    out.mkdir()
    path = out / FILENAME
    if content == "foreign":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE notes (x TEXT)")
        db.commit()
        db.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    code, results = grade([str(SLOW / "l2norm_slow_a.py"), "--task", str(task)], out, cache_dir)
    assert code == 2 and results is None
    err = capsys.readouterr().err
    assert str(path) in err and "move it away" in err
    assert path.read_bytes() == before
    assert cli.main(["report", "--out", str(out)]) == 2
    assert path.read_bytes() == before


def test_report_writes_are_atomic(tmp_path, monkeypatch):
    store = Store(tmp_path)
    run_id = store.start_run(kbench_version="0", task="l2norm", task_hash="h", seed=1,
                             device="cpu", fingerprint="f", options={}, environment={})
    run = store.load_run(run_id)
    report_folder.write(run, tmp_path)
    old = (tmp_path / "leaderboard.md").read_text()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    run.notes.append("a change that never lands")
    with pytest.raises(OSError, match="disk full"):
        report_folder.write(run, tmp_path)
    assert (tmp_path / "leaderboard.md").read_text() == old
    assert not [p for p in tmp_path.iterdir()
                if p.name.startswith(".") and p.name not in (LOCK_NAME, OPENING_LOCK)]


def test_reuse_needs_same_kbench_task_and_software(tmp_path):
    from kbench.host.environment import fingerprint
    from kbench.results.run_record import ProblemRun, SubmissionResult
    from kbench.results.verdict import Status

    store = Store(tmp_path)
    env = {"device": "cuda", "device_name": "NVIDIA H200", "torch": "2.11.0", "driver": "580"}
    run_id = store.start_run(kbench_version="0.1.0", task="l2norm", task_hash="set", seed=1,
                             device="cuda", fingerprint=fingerprint(env),
                             options={"case_indices": None, "timing": "eager"}, environment=env)
    store.set_problem(run_id, ProblemRun(name="l2norm", path="l2norm.yaml", digest="t1"))
    store.add_result(run_id, SubmissionResult(name="l2norm_x", path="x.py", sha256="abc",
                                              status=Status.OK, speedup=1.5, problem="l2norm"))
    fp = fingerprint(env)
    asked = Options(device="cuda", out_dir=tmp_path, cache_dir=tmp_path, jobs=1, seed=1)

    def reusable(sha: str, task: str = "t1", version: str = "0.1.0", fp: str = fp, **changed):
        return store.reusable(sha, task, version, fp, replace(asked, **changed).reuse_key(),
                              Options.unrecorded())

    # a run stored without a profile, rules or policy (older kbench) counts as their defaults
    assert reusable("abc")[0] == run_id
    assert reusable("abd") is None  # another file
    assert reusable("abc", "t2") is None  # another problem
    assert reusable("abc", version="0.2.0") is None  # another kbench
    assert reusable("abc", timing="graph") is None  # timing mode
    assert reusable("abc", profile="quick") is None  # profile
    assert reusable("abc", require_custom_kernels=True) is None  # policy
    assert reusable("abc", rules="kernelbench") is None  # rules
    assert reusable("abc", atol=0.01) is None  # tolerance
    for key, value in (("torch", "2.12.0"), ("device_name", "NVIDIA H100"), ("driver", "590")):
        assert reusable("abc", fp=fingerprint({**env, key: value})) is None
    # Not reused: what the machine could not grade, and a correct result with no speedup
    # (the reference failed alongside it); a resume grades the first again.
    for name, sha, status, speedup in (("l2norm_env", "e", Status.ENVIRONMENT_ERROR, None),
                                       ("l2norm_lost", "l", Status.INFRASTRUCTURE_ERROR, None),
                                       ("l2norm_nospeed", "n", Status.OK, None)):
        store.add_result(run_id, SubmissionResult(name=name, path="y.py", sha256=sha,
                                                  status=status, speedup=speedup,
                                                  problem="l2norm"))
        assert reusable(sha) is None
    assert store.graded_names(run_id) == {"l2norm_x", "l2norm_nospeed"}


def test_a_store_of_version_2_is_carried_over(tmp_path):
    import json
    import sqlite3

    from kbench.results.run_record import SubmissionResult
    from kbench.results.verdict import Status

    store = Store(tmp_path)
    run_id = store.start_run(kbench_version="0.2.0", task="l2norm", task_hash="t1", seed=1,
                             device="cpu", fingerprint="f", options={}, environment={})
    store.add_result(run_id, SubmissionResult(name="l2norm_x", path="x.py", sha256="abc",
                                              status=Status.OK, speedup=1.5, problem="l2norm"))
    store.close()
    # Back to what kbench 0.2 wrote: no problems table, no problem column, the reference
    # table in runs.
    db = sqlite3.connect(tmp_path / "kbench.sqlite3")
    reference = [{"params": {"batch": 16, "dim": 1024}, "dtype": "float32"}]
    db.executescript("DROP TABLE problems; ALTER TABLE results DROP COLUMN problem; "
                     "PRAGMA user_version = 2;")
    db.execute("UPDATE runs SET reference = ?, copy_gbps = 3000", (json.dumps(reference),))
    db.commit()
    db.close()
    run = Store(tmp_path).load_run(run_id)
    [problem] = run.problems
    assert (problem.name, problem.digest, problem.copy_gbps) == ("l2norm", "t1", 3000)
    assert problem.reference[0].params == {"batch": 16, "dim": 1024}
    assert [s.problem for s in run.submissions] == ["l2norm"]
