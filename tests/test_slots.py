"""Several evaluation slots, on this host and on Ray: the same verdicts as one local slot on the
same seed, even when a slot's process is killed mid-run (its unit is graded again)."""

import json
import shutil
import subprocess
import sys
import threading
import time
import types
from dataclasses import replace

import psutil
import pytest
from conftest import FIXTURES, PROBLEM_SET_ARGS, ROOT, grade

from kbench.grading.jobs import Job
from kbench.grading.options import Device, Options, OptionsError
from kbench.grading.running import units
from kbench.grading.running.slots import specs

# The problems the killed runs grade: every one whose verdict could hang on where or after what
# a unit runs (parameters drawn at init, a random reference, training-mode state, a size that
# fails, the task errors) and two plain ones, about two thirds of the set's submissions; the
# others' verdicts are checked in one slot by test_problems.
_KILLED_RUN_PROBLEMS = ("argmax_rows", "batchnorm_train", "broken_dict_output",
                        "broken_inputs_raise", "broken_no_model", "broken_random", "linear_relu",
                        "rnn_cell", "scaled_add")


def _verdicts(results: dict, problems: tuple[str, ...] | None = None) -> dict[str, tuple]:
    """Each submission's verdict, of ``problems`` only where given."""
    return {s["name"]: (s["problem"], s["status"], s["reason"], s["cases_passed"])
            for s in results["submissions"] if problems is None or s["problem"] in problems}


def _kill_busy(pattern: str, killed: list[str], timeout_s: float = 120) -> None:
    """Kill -9 the first process below this one whose command line has ``pattern`` and that
    has a child of its own (a worker: it is grading)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.Process().children(recursive=True):
            try:
                command = " ".join(proc.cmdline())
                if pattern not in command or not proc.children():
                    continue
                proc.kill()
            except psutil.Error:
                continue
            # Once: a second slot killed could take the first's unit again, past its retry.
            killed.append(f"{proc.pid}: {command}")
            return
        time.sleep(0.2)


def _graded_while_killing(pattern: str, args: list[str], out, cache_dir
                          ) -> tuple[dict, list[str], str]:
    """``kbench grade`` of the fixture problem set's _KILLED_RUN_PROBLEMS, on its options, in a
    process of its own (Ray, once started, patches the process that starts it), while the
    first busy ``pattern`` process is killed."""
    subs = out.parent / "problem_subs"
    for problem in _KILLED_RUN_PROBLEMS:
        shutil.copytree(FIXTURES / "problem_subs" / problem, subs / problem)
    killed: list[str] = []
    killer = threading.Thread(target=_kill_busy, args=(pattern, killed), daemon=True)
    killer.start()
    done = subprocess.run([sys.executable, "-m", "kbench", "grade", str(subs),
                           *PROBLEM_SET_ARGS[1:], *args,
                           "--out", str(out), "--cache-dir", str(cache_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    killer.join()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), killed, done.stdout + done.stderr


def test_several_slots_with_one_killed_give_the_same_verdicts(problem_set_run, tmp_path,
                                                               cache_dir):
    results, killed, output = _graded_while_killing("kbench.grading.running.slots",
                                                    ["--slots", "3"], tmp_path / "reports",
                                                    cache_dir)
    assert killed, "no slot process was seen grading"
    assert "queued again" in output
    assert _verdicts(results) == _verdicts(problem_set_run[1], _KILLED_RUN_PROBLEMS), \
        output[-4000:]
    assert results["environment"]["slots"] == ["cpu 0", "cpu 1", "cpu 2"]


def test_ray_with_a_worker_killed_gives_the_same_verdicts(problem_set_run, tmp_path,
                                                          cache_dir):
    pytest.importorskip("ray", reason="the Ray extra: pip install -e '.[ray]'")
    results, killed, output = _graded_while_killing(
        "ray::grade", ["--executor", "ray", "--slots", "2"], tmp_path / "reports", cache_dir)
    assert killed, "no Ray worker was seen grading"
    assert _verdicts(results) == _verdicts(problem_set_run[1], _KILLED_RUN_PROBLEMS), \
        output[-4000:]


_OPTIONS = Options(device="cpu", out_dir=".", cache_dir=".", jobs=1, seed=1)


def _job(problem: str, name: str) -> Job:
    return Job(task=f"{problem}.py", problem=problem, name=name, path=f"{name}.py",
               sha256="0", options=_OPTIONS)


def test_units_keep_problems_whole_while_there_are_enough():
    jobs = [_job(p, f"{p}_{i}") for p in "abcd" for i in range(3)]
    assert [len(u.jobs) for u in units.split(jobs, 2, None, 4)] == [3, 3, 3, 3]
    one = [_job("a", f"a_{i}") for i in range(8)]
    assert [len(u.jobs) for u in units.split(one, 2, None, 4)] == [4, 4]
    assert [len(u.jobs) for u in units.split(one, 3, None, 4)] == [3, 3, 2]
    assert [len(u.jobs) for u in units.split(one[:1], 8, None, 4)] == [1]


def test_a_problem_with_most_of_the_run_is_shared_out_largest_first():
    # Whole problems would give one slot 10 submissions and the other 2.
    jobs = [_job("b", f"b_{i}") for i in range(2)] + [_job("a", f"a_{i}") for i in range(10)]
    split = units.split(jobs, 2, None, 4)
    assert [(u.jobs[0].problem, len(u.jobs)) for u in split] == [("a", 5), ("a", 5), ("b", 2)]
    assert [u.number for u in split] == [0, 1, 2]
    assert sorted(j.name for u in split for j in u.jobs) == sorted(j.name for j in jobs)


def test_a_lost_job_is_an_infrastructure_error_graded_again_by_resume():
    (result,) = units.lost([_job("a", "a_0")], "its slot (gpu 1) process ended")
    assert result.status.value == "infrastructure_error"
    assert "gpu 1" in result.reason and "--resume" in result.reason


def test_gpus_are_checked():
    with pytest.raises(OptionsError, match="--gpus"):
        specs(Device.CPU, ["0"], 1)
    assert [s.name for s in specs(Device.CPU, None, 2)] == ["cpu 0", "cpu 1"]


def test_several_cpu_slots_do_not_time(tmp_path, cache_dir, capsys):
    # Their timings would share the cores: a verdict would depend on what ran alongside.
    code, results = grade([str(FIXTURES / "cpu" / "l2norm_torch_ok.py"), "--device", "cpu",
                           "--slots", "2"], tmp_path, cache_dir)
    assert code == 2 and results is None
    assert "add --no-timing" in capsys.readouterr().err


def test_a_problem_graded_on_several_slots_keeps_one_record():
    from kbench.results.run_record import Benchmark, ProblemRun

    class Sink:
        problems: list[ProblemRun] = []

        def problem(self, problem):
            self.problems.append(problem)

    def record(table: str, note: str) -> units.Event:
        event = units.Event(problem=ProblemRun("p", "p.py", "d", notes=[note], reference=[
            Benchmark(params={"n": 1}, dtype=table)]))
        return units.Event.from_dict(json.loads(json.dumps(event.to_dict())))  # as it travels

    sink = Sink()
    deliver = units.Delivery(sink, print)
    deliver(record("first", "screened on gpu 0"), "gpu 0", "gpu 0")
    deliver(record("second", "screened on gpu 1"), "gpu 1", "gpu 1")
    deliver(record("first, end", "drifted on gpu 0"), "gpu 0", "gpu 0")
    last = sink.problems[-1]
    assert last.reference[0].dtype == "first, end"  # the first slot's table, as it last was
    assert last.notes[:3] == ["screened on gpu 0", "screened on gpu 1", "drifted on gpu 0"]
    assert "graded in 2 places" in last.notes[3]


def test_slots_that_cannot_start_leave_no_job_without_a_verdict(tmp_path, monkeypatch):
    from kbench.grading.options import Options
    from kbench.grading.running import slots

    def cannot_start(slot, cpus):
        raise OSError("exec format error")

    class Sink:
        def __init__(self):
            self.results = []

        def problem(self, problem):
            pass

        def result(self, result):
            self.results.append(result)

    monkeypatch.setattr(slots, "_start", cannot_start)
    options = Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=1, seed=1)
    sink = Sink()
    slots.SlotsExecutor(options, specs(Device.CPU, None, 2)).run(
        [_job("a", "a_0"), _job("b", "b_0"), _job("b", "b_1")], sink)
    assert sorted(r.name for r in sink.results) == ["a_0", "b_0", "b_1"]
    assert {r.status.value for r in sink.results} == {"infrastructure_error"}


def test_each_unit_says_its_lines_through_its_own_emit(tmp_path, monkeypatch):
    # A Ray worker process grades many units, each returning its own list of events.
    from kbench.grading.options import Options
    from kbench.grading.running.local import LocalExecutor

    monkeypatch.setattr(LocalExecutor, "run",
                        lambda self, jobs, *rest, **kw: self.say(jobs[0].name))
    options = Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=1, seed=1)
    first, second = [], []
    for name, events in (("a_0", first), ("b_0", second)):
        job = Job(task="t.py", problem="p", name=name, path=f"{name}.py", sha256="0",
                  options=options)
        units.run(units.Unit([job], None, 1), events.append)
    assert first == [units.Event(say="a_0")] and second == [units.Event(say="b_0")]


def test_a_problem_told_to_come_next_compiles_ahead_and_stops_while_another_is_timed(
        tmp_path, cache_dir, monkeypatch):
    # On a one-GPU host the bundled problems each waited 10-14 s for their torch.compile
    # baseline as they closed: it is compiled from the moment the slot hears the problem comes.
    import contextlib

    from conftest import quick_task

    from kbench.grading.running import open_problem

    stopped: dict[str, int] = {}

    class Compiling:  # torch.compile's process, as the problem sees it
        made: list[str] = []

        def __init__(self, ctx, log, skips):
            self.task, self.skips, self.timed = str(ctx.task.path), skips, False
            self.ahead = None
            Compiling.made.append(self.task)

        def start(self):
            self.ahead = types.SimpleNamespace(channel=types.SimpleNamespace(
                frozen=lambda: self._stopped()))

        @contextlib.contextmanager
        def _stopped(self):
            stopped[self.task] = stopped.get(self.task, 0) + 1
            yield

        def time(self):
            self.ahead, self.timed = None, True
            return [None] * len(self.skips), "not timed in this test"

        def close(self):
            self.ahead = None

    monkeypatch.setattr(open_problem, "Compiled", Compiling)
    tasks = [quick_task(tmp_path / name, **{"timing.compile_reference": True})
             for name in ("a", "b")]
    options = Options(device="cpu", out_dir=tmp_path / "out", cache_dir=cache_dir, jobs=1,
                      seed=3)
    sub = FIXTURES / "cpu" / "l2norm_torch_ok.py"
    first, then = (Job(task=str(t), problem="l2norm", name=f"ok_{k}", path=str(sub),
                       sha256="0", options=options) for k, t in enumerate(tasks))
    events: list[units.Event] = []
    unit = units.Unit([first], None, 1, run_tasks=tuple(map(str, tasks)),
                      run_files=(str(sub),), spare=(0,), soon=(then,))
    units.run(unit, events.append)
    assert Compiling.made == [str(tasks[1]), str(tasks[0])]  # the problem told of, first
    # Stopped while the first problem's reference, its submission, its torch.compile and its
    # drift check were timed.
    assert stopped[str(tasks[1])] >= 4 and stopped[str(tasks[0])] >= 1  # its own: timed
    assert [e.result.status.value for e in events if e.result] == ["ok"]
    # Its record waits for a submission of it graded here: another slot may grade it.
    assert {e.problem.path for e in events if e.problem} == {str(tasks[0])}
    (executor,) = units._executors.values()  # the next problem's, kept for its turn
    compiling = executor.problems[(str(tasks[1]), "l2norm")].compiling
    assert compiling.task == str(tasks[1]) and compiling.ahead is not None
    later: list[units.Event] = []  # its turn: its screening's record first, then its own
    units.run(replace(unit, jobs=[then], soon=()), later.append)
    records = [e.problem for e in later if e.problem]
    assert records[0].path == str(tasks[1]) and "screening" in records[0].stage_s
    assert [e.result.status.value for e in later if e.result] == ["ok"]
    assert compiling.timed and Compiling.made == [str(tasks[1]), str(tasks[0])]
    units.finish(events.append)
