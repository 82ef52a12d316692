"""The host's build pipeline (kbench.grading.building.pipeline), the host split, the dispatch of
units to slots as their builds come out, and workers started ahead of need. The builds here are
stand-ins (each records when it ran) except where a real import is the point."""

import os
import threading
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from kbench import sandbox
from kbench.grading.building import build, hostsplit, pipeline
from kbench.grading.building.build import Built
from kbench.grading.building.guard import BuildMark
from kbench.grading.jobs import Job
from kbench.grading.options import Device, Options
from kbench.grading.running import units
from kbench.grading.running.dispatch import Dispatch
from kbench.host import spawn
from kbench.host.toolchain import find_toolchain
from kbench.results.verdict import Status, Verdict

PROBLEMS = FIXTURES / "problems"
SUBS = FIXTURES / "problem_subs"


def _options(tmp_path: Path, jobs: int) -> Options:
    return Options(device="cpu", out_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
                   jobs=jobs, seed=3)


def _jobs(options: Options, *names: str) -> list[Job]:
    """Jobs for fixture submissions named ``problem/file``."""
    jobs = []
    for name in names:
        problem, stem = name.split("/")
        path = SUBS / problem / f"{stem}.py"
        jobs.append(Job(task=str(PROBLEMS / f"{problem}.py"), problem=problem, name=name,
                        path=str(path), sha256="0", options=options))
    return jobs


class _Builds:
    """Stand-in builds: each records its start and end, takes ``seconds`` (per name), and
    runs ``act`` (per name) as a submission's module-level code would."""

    def __init__(self, seconds: dict[str, float] | None = None, act: dict | None = None):
        self.seconds, self.act = seconds or {}, act or {}
        self.log: list[tuple[str, str, float]] = []
        self.nice: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, ctx, sub, environment_problem, cores, cpus=(), nice=0, lock_wait_s=None
                 ) -> Built:
        with self.lock:
            self.log.append(("start", sub.name, time.monotonic()))
            self.nice[sub.name] = nice
        time.sleep(self.seconds.get(sub.name, 0.05))
        if sub.name in self.act:
            self.act[sub.name]()
        with self.lock:
            self.log.append(("end", sub.name, time.monotonic()))
        return Built(None, 0.01)

    def order(self, event: str) -> list[str]:
        return [name for what, name, _ in self.log if what == event]


def _pipeline(options: Options, builds: _Builds, monkeypatch, jobs: int | None = None,
              lines: list[str] | None = None) -> pipeline.Pipeline:
    monkeypatch.setattr(build, "build", builds)
    split = hostsplit.unsplit(1, jobs or options.jobs, [0, 1, 2, 3])
    say = (lines.append if lines is not None else lambda line: None)
    return pipeline.Pipeline(options, find_toolchain(None, options.cache_dir / "toolkits"),
                             None, split, say)


def test_builds_start_in_the_order_given_and_come_out_as_each_problem_s_end(tmp_path,
                                                                          monkeypatch):
    options = _options(tmp_path, jobs=2)
    jobs = _jobs(options, "scaled_add/honest", "scaled_add/ignores_alpha",
                 "linear_relu/honest", "linear_relu/draws_first", "mean_std/honest")
    builds = _Builds(seconds={"linear_relu/draws_first": 1.0})
    with _pipeline(options, builds, monkeypatch) as pool:
        pool.start(jobs)
        first = pool.wait(jobs[:2])  # scaled_add's builds, without waiting for the slow one
        assert "linear_relu/draws_first" not in builds.order("end")
        pool.finish()
    started = builds.order("start")  # taken in order; two taken together may start either way
    assert sorted(started) == sorted(j.name for j in jobs)
    assert all(started.index(j.name) <= k + 1 for k, j in enumerate(jobs))
    assert set(first) == {j.path for j in jobs[:2]}
    assert all(b.verdict is None for b in first.values())
    assert set(pool.built()) == {j.path for j in jobs} and not pool.suspects()
    assert not BuildMark(options.cache_dir).busy()


def test_the_first_builds_run_ahead_of_the_rest(tmp_path, monkeypatch):
    # Two a slot at the pool's priority, so they come out first where builds outnumber the
    # cores; the rest lower, still on every core.
    options = _options(tmp_path, jobs=5)
    jobs = _jobs(options, "scaled_add/honest", "scaled_add/ignores_alpha", "linear_relu/honest",
                 "linear_relu/draws_first", "mean_std/honest")
    builds = _Builds()
    with _pipeline(options, builds, monkeypatch) as pool:
        pool.start(jobs)
        pool.finish()
    nice = pool.split.nice
    assert [builds.nice[j.name] for j in jobs] == [nice, nice] + [nice + 5] * 3


def test_every_build_core_is_kept_busy_while_builds_are_left(tmp_path, monkeypatch):
    # Three at a time: a fourth starts the moment one ends, not when the three all have.
    options = _options(tmp_path, jobs=3)
    jobs = _jobs(options, "scaled_add/honest", "scaled_add/ignores_alpha", "linear_relu/honest",
                 "linear_relu/draws_first")
    builds = _Builds(seconds={"scaled_add/honest": 0.1, "scaled_add/ignores_alpha": 1.5,
                              "linear_relu/honest": 1.5})
    with _pipeline(options, builds, monkeypatch) as pool:
        pool.start(jobs)
        pool.finish()
    times = {(what, name): t for what, name, t in builds.log}
    fourth = times[("start", "linear_relu/draws_first")]
    assert fourth < times[("end", "scaled_add/ignores_alpha")]  # not after the slow ones
    assert fourth < times[("end", "linear_relu/honest")]


def test_the_pipeline_is_busy_for_grading_windows_until_it_finishes(tmp_path, monkeypatch):
    options = _options(tmp_path, jobs=1)
    jobs = _jobs(options, "scaled_add/honest")
    mark = BuildMark(options.cache_dir)
    with _pipeline(options, _Builds(seconds={"scaled_add/honest": 0.5}), monkeypatch) as pool:
        pool.start(jobs)
        assert mark.busy()
        pool.finish()
        assert not mark.busy()


def test_a_build_that_writes_a_run_file_is_found_alone_and_the_rest_handed_out(tmp_path,
                                                                              monkeypatch):
    # A stand-in "submission" whose build rewrites another submission of the run: every
    # build then in flight is a suspect; built again alone, only the writer changes it again.
    subs = tmp_path / "subs"
    for name in ("writer", "victim", "bystander", "later"):
        (subs / "scaled_add").mkdir(parents=True, exist_ok=True)
        (subs / "scaled_add" / f"{name}.py").write_text((SUBS / "scaled_add" / "honest.py")
                                                         .read_text())
    victim = subs / "scaled_add" / "victim.py"
    options = _options(tmp_path, jobs=2)
    jobs = [Job(task=str(PROBLEMS / "scaled_add.py"), problem="scaled_add",
                name=f"scaled_add/{n}", path=str(subs / "scaled_add" / f"{n}.py"), sha256="0",
                options=options) for n in ("writer", "bystander", "victim", "later")]
    text = victim.read_text()
    builds = _Builds(seconds={"scaled_add/bystander": 0.4, "scaled_add/victim": 0.6},
                     act={"scaled_add/writer": lambda: victim.write_text("# mine\n")})
    lines: list[str] = []
    with _pipeline(options, builds, monkeypatch, lines=lines) as pool:
        pool.start(jobs)
        pool.finish()
        assert victim.read_text() == text  # put right at once
        suspects = {j.name for j in pool.suspects()}
        # Whatever ran between the check before and the check that saw it; the bystander
        # surely (it ran beside the writer), maybe the build that started as the writer ended.
        assert {"scaled_add/writer", "scaled_add/bystander"} <= suspects
        assert "scaled_add/later" not in suspects
        assert set(pool.built()) == {j.path for j in jobs if j.name not in suspects}
        settled = pool.settle()
    assert victim.read_text() == text
    verdicts = {Path(p).stem: b.verdict for p, b in settled.items()}
    assert set(verdicts) == {s.split("/")[1] for s in suspects}
    assert all(v is None for name, v in verdicts.items() if name != "writer")
    assert verdicts["writer"].status is Status.FLAGGED and "while building" in \
        verdicts["writer"].reason
    assert any("built again alone" in line for line in lines)


def test_a_build_that_breaks_kbench_still_comes_out(tmp_path, monkeypatch):
    options = _options(tmp_path, jobs=1)
    jobs = _jobs(options, "scaled_add/honest", "mean_std/honest")

    def broken(ctx, sub, *rest, **kw):
        raise RuntimeError("kbench's own bug")
    monkeypatch.setattr(build, "build", broken)
    split = hostsplit.unsplit(1, 1, [0])
    with pipeline.Pipeline(options, find_toolchain(None, options.cache_dir / "toolkits"), None,
                           split) as pool:
        pool.start(jobs)
        assert pool.wait(jobs) == {j.path: None for j in jobs}  # the grader builds them


def test_each_slot_gets_a_problem_s_jobs_as_their_builds_come_out(tmp_path, monkeypatch):
    options = _options(tmp_path, jobs=4)
    jobs = _jobs(options, "linear_relu/honest", "linear_relu/draws_first", "scaled_add/honest",
                 "scaled_add/ignores_alpha")
    builds = _Builds(seconds={"linear_relu/honest": 2.0})
    template = units.Unit([], None, 1)
    with _pipeline(options, builds, monkeypatch) as pool:
        dispatch = Dispatch(jobs, pool, template)
        pool.start(jobs)
        pool.wait(jobs[1:])
        # Not the problem's last build: a unit of what is out, the problem held open.
        unit, tries = dispatch.get("gpu 0")
        assert [j.name for j in unit.jobs] == ["linear_relu/draws_first"] and not unit.last
        assert tries == 0 and set(unit.built) == {jobs[1].path}
        unit, _ = dispatch.get("gpu 1")  # another problem, whole, closed after it
        assert [j.name for j in unit.jobs] == ["scaled_add/honest", "scaled_add/ignores_alpha"]
        assert unit.last and unit.number == 1
        # linear_relu's slow build goes to gpu 0, which holds it; gpu 1 waits, then is done.
        other: list = []
        waiting = threading.Thread(target=lambda: other.append(dispatch.get("gpu 1")))
        waiting.start()
        unit, _ = dispatch.get("gpu 0")
        waiting.join(10)
        assert [j.name for j in unit.jobs] == ["linear_relu/honest"] and unit.last
        assert other == [None]
        pool.finish()


def test_an_idle_slot_takes_half_of_a_backlog_another_slot_holds(tmp_path, monkeypatch):
    options = _options(tmp_path, jobs=4)
    jobs = _jobs(options, "scaled_add/honest", "scaled_add/ignores_alpha", "scaled_add/sparse",
                 "argmax_rows/honest", "argmax_rows/argmin", "argmax_rows/int32")
    builds = _Builds(seconds={j.name: 0.6 for j in jobs[1:]})
    with _pipeline(options, builds, monkeypatch, jobs=1) as pool:
        dispatch = Dispatch(jobs[:3], pool, units.Unit([], None, 1))
        pool.start(jobs[:3])
        pool.wait(jobs[:1])
        first, _ = dispatch.get("gpu 0")
        pool.wait(jobs[:3])
        stolen, _ = dispatch.get("gpu 1")  # two ready, held by gpu 0: one of them
        rest, _ = dispatch.get("gpu 0")
        pool.finish()
    assert [len(u.jobs) for u in (first, stolen, rest)] == [1, 1, 1]
    assert not first.last and not stolen.last and rest.last
    assert dispatch.get("gpu 1") is None


def test_a_slot_is_told_which_problems_come_to_it_next_and_gets_them(tmp_path, monkeypatch):
    options = _options(tmp_path, jobs=4)
    jobs = _jobs(options, "scaled_add/honest", "argmax_rows/honest", "linear_relu/honest",
                 "mean_std/honest")
    with _pipeline(options, _Builds(), monkeypatch) as pool:
        dispatch = Dispatch(jobs, pool, units.Unit([], None, 1))
        pool.start(jobs)
        pool.wait(jobs)
        first, _ = dispatch.get("gpu 0")  # the next two problems, to prepare meanwhile
        assert [j.name for j in first.jobs] == ["scaled_add/honest"]
        assert [j.name for j in first.soon] == ["argmax_rows/honest", "linear_relu/honest"]
        other, _ = dispatch.get("gpu 1")  # one no slot was told of, first
        assert [j.name for j in other.jobs] == ["mean_std/honest"] and other.soon == ()
        told, _ = dispatch.get("gpu 0")  # told of two not yet taken already: none more
        assert [j.name for j in told.jobs] == ["argmax_rows/honest"] and told.soon == ()
        rest, _ = dispatch.get("gpu 1")  # rather than wait: what gpu 0 was told of
        assert [j.name for j in rest.jobs] == ["linear_relu/honest"]
        assert units.Unit.from_dict(first.to_dict()).soon == first.soon  # it travels
        pool.finish()


def test_the_host_split_keeps_cores_for_timing_only_where_builds_keep_half():
    four = hostsplit.plan(4, Device.CUDA, None, list(range(64)))
    assert four.timing == ((0, 1), (2, 3), (4, 5), (6, 7)) and four.build == tuple(range(8, 64))
    assert four.build_jobs == 56 and four.cores_per_build() == 2
    assert "slot 3: cores 6-7" in four.describe() and "56 at a time on cores 8-63" in \
        four.describe()
    assert hostsplit.plan(1, Device.CUDA, 4, list(range(16))).cores_per_build() == 3
    assert not hostsplit.plan(4, Device.CUDA, None, list(range(12))).split  # too few cores
    cpu = hostsplit.plan(1, Device.CPU, None, [0, 1])
    assert not cpu.split and cpu.build == (0, 1) and "host not split" in cpu.describe()
    # Builds yield only to a timing on their cores: on cores of their own, under other users'
    # load, a lower priority starved them.
    assert four.nice == 0 and cpu.nice > 0 and "at nice 0" in four.describe()


def test_a_worker_started_ahead_is_the_one_its_sandbox_uses(tmp_path):
    log = tmp_path / "logs" / "x.run.log"
    env = sandbox.child_env({})
    spawn.prestart(log, env, "cpu")
    spare = spawn._SPARES[log].proc.pid
    with sandbox.Sandbox(log, env, memory_bytes=8 << 30, log_bytes=1 << 20) as box:
        assert box.proc.pid == spare
    spawn.prestart(log, env, "cpu")
    other = spawn._SPARES[log].proc
    with sandbox.Sandbox(log, {**env, "EXTRA": "1"}, memory_bytes=8 << 30,
                         log_bytes=1 << 20) as box:  # another environment: not that one
        assert box.proc.pid != other.pid
    assert other.wait(timeout=10) is not None  # the unused spare was ended
    spawn.prestart(log, env, "cpu")
    gone = spawn._SPARES[log].proc
    spawn.drop_spares()
    assert gone.wait(timeout=10) is not None and not spawn._SPARES


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux CPU affinity")
def test_a_build_runs_on_the_build_cores_at_low_priority(tmp_path):
    cores = sorted(os.sched_getaffinity(0))[-1:]
    log = tmp_path / "b.log"
    with sandbox.Sandbox(log, sandbox.child_env({}), memory_bytes=8 << 30, log_bytes=1 << 20,
                         cpus=tuple(cores), nice=7) as box:
        import psutil

        proc = psutil.Process(box.proc.pid)
        assert proc.cpu_affinity() == cores and proc.nice() >= 7


def test_a_verdict_that_travels_comes_back_the_same():
    for built in (Built(None, 1.5), Built(Verdict(Status.BUILD_ERROR, "nvcc: x"), 2.0)):
        assert Built.from_dict(built.to_dict()) == built


def test_a_build_that_plants_files_where_a_later_build_will_load_is_found(tmp_path,
                                                                           monkeypatch):
    # One build at a time: the planter ends before its victim starts, so the victim's
    # folder (not yet filled by its own build) is compared, and the planted file found.
    options = _options(tmp_path, jobs=1)
    jobs = _jobs(options, "scaled_add/honest", "scaled_add/ignores_alpha")
    toolchain = find_toolchain(None, options.cache_dir / "toolkits")
    victim = build.build_dir(options.cache_dir, Path(jobs[1].path), toolchain)

    def plant():
        victim.mkdir(parents=True, exist_ok=True)
        (victim / "scaled_add.so").write_bytes(b"not what its source builds")
    builds = _Builds(act={"scaled_add/honest": plant})
    with _pipeline(options, builds, monkeypatch) as pool:
        pool.start(jobs)
        pool.finish()
        assert {j.name for j in pool.suspects()} == {"scaled_add/honest"}
        assert not (victim / "scaled_add.so").exists()  # its build folder deleted
        settled = pool.settle()
    assert settled[jobs[0].path].verdict.status is Status.FLAGGED


def test_a_window_beside_the_pipeline_leaves_the_repair_to_it_and_counts_its_repairs(tmp_path):
    # Two windows putting files right at once could undo each other (a grading window's
    # snapshot may hold a build's doing): beside a pipeline, a grading window only reports.
    from kbench.grading.building.watch import Watcher

    options = _options(tmp_path, jobs=1)
    watcher, pool_mark = Watcher(options), BuildMark(options.cache_dir)
    own = tmp_path / "sub.py"
    own.write_text("honest\n")
    pool_mark.hold()
    try:
        changed = watcher.watch([own], [])
        own.write_text("rewritten\n")
        finding = changed()
        assert finding.builds_beside and finding.lines and own.read_text() == "rewritten\n"
        own.write_text("honest\n")
        changed = watcher.watch([own], [])
        pool_mark.repaired()  # the pipeline put something right meanwhile
        assert "the build pipeline put them right" in changed().lines[0]
    finally:
        pool_mark.release()
    changed = watcher.watch([own], [])
    own.write_text("rewritten\n")
    finding = changed()
    assert not finding.builds_beside and own.read_text() == "honest\n"  # alone: put right
