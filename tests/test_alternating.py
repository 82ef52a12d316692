"""The order of a submission's timing rounds (kbench.grading.timing.alternating), with the
processes, the reference and the checks stood in for: which processes run when."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from kbench.grading.channel import Stop
from kbench.grading.context import Spare
from kbench.grading.options import RIGOUR, Profile, TimingMode
from kbench.grading.timing import alternating, integrity, kernelbench_timing, measurement
from kbench.results.run_record import Benchmark
from kbench.results.verdict import Status, Verdict

QUICK = RIGOUR[Profile.QUICK]


class _Process:
    def __init__(self, name: str, events: list, fail: bool = False) -> None:
        self.name, self.events, self.fail = name, events, fail
        self.is_frozen = self.closed = False

    @contextlib.contextmanager
    def frozen(self):
        assert not self.is_frozen
        self.is_frozen = True
        try:
            yield
        finally:
            self.is_frozen = False

    def samples(self, params, count, keep=False):
        if self.fail:
            raise Stop(Verdict(Status.RUNTIME_ERROR, "crashed"))
        assert not self.is_frozen and not self.closed
        self.events.append(("round", self.name, params["n"],
                            {p.name: p.is_frozen for p in _open(self.events)}))
        return SimpleNamespace(kept=[])

    def close(self) -> None:
        self.closed = True
        self.events.append(("close", self.name))


def _open(events: list) -> list[_Process]:
    return [p for p in events[0] if not p.closed]


class _Reference:
    def __init__(self, events: list, r: int) -> None:
        self.events, self.r = events, r

    def samples(self, index, params, count):
        self.events.append(("reference", self.r, params["n"],
                            {p.name: p.is_frozen for p in _open(self.events)}))
        return SimpleNamespace()


def _time(monkeypatch, processes: list[_Process], fail_round: int | None = None) -> list:
    for module, name in ((integrity, "verify"), (integrity, "trusted_clock"),
                         (integrity, "ordered"), (integrity, "within_copy_bandwidth"),
                         (measurement, "add_speedups"), (kernelbench_timing, "overall")):
        monkeypatch.setattr(module, name, lambda *a, **k: None)
    monkeypatch.setattr(measurement, "summarise", lambda rounds, nbytes: len(rounds))
    monkeypatch.setattr(alternating.kb_rules, "applies", lambda ctx: False)
    events: list = [processes]
    main = _Process("main", events)
    processes.append(main)

    def open_rounds(rounds: int, warms: list) -> list[_Process]:
        assert not [e for e in events[1:] if e[0] == "round"]  # before the first round
        new = [_Process(f"round{r + 1}", events, fail=r == fail_round) for r in range(1, rounds)]
        processes.extend(new)
        events.append(("opened", rounds, [w for _, w in warms]))
        return new

    ctx = SimpleNamespace(
        options=SimpleNamespace(timing=TimingMode.EAGER, rigour=QUICK),
        task=SimpleNamespace(timing={"cuda": SimpleNamespace(fresh_rounds_below_ms=0.1)}),
        device=SimpleNamespace(type="cuda"), traffic=lambda params: None,
        warm_request=lambda params: f"warm-up at n={params['n']}")
    reference = [Benchmark(params={"n": n}, dtype="float32",
                           reference=SimpleNamespace(ms=ms)) for n, ms in ((1, 0.01), (2, 5.0))]
    def ready(warms: list, eager: bool) -> None:
        events.append(("ready", [w for _, w in warms], eager,
                        {p.name: p.is_frozen for p in _open(events)}))

    pool = SimpleNamespace(main=_Reference(events, 0),
                           rounds=[_Reference(events, r) for r in range(QUICK.fresh_rounds)],
                           copy_gbps=None, failures=lambda: set(), ready=ready)
    result = SimpleNamespace(benchmarks=[], timing_s={}, flags=[])
    judge = SimpleNamespace(checked=lambda check: check(), disturbed=lambda: False)
    alternating.time_submission(ctx, main, result, reference, pool, open_rounds, judge)
    return events[1:]


def test_launch_bound_rounds_open_their_processes_at_once_and_stop_all_for_the_reference(
        monkeypatch):
    processes: list[_Process] = []
    events = _time(monkeypatch, processes)
    # The reference's processes for the fresh rounds and the clock open first, the
    # submission stopped meanwhile; then the submission's round processes, all at once; both
    # warmed up on the launch-bound case (n=1) as they open.
    warmed = ["warm-up at n=1"]
    assert events[:2] == [("ready", warmed, True, {"main": True}),
                          ("opened", QUICK.fresh_rounds, warmed)]
    # Every process of the submission, those whose round is done too, is stopped while the
    # reference runs; the round processes end together after the last launch-bound round.
    for _, *rest, states in (e for e in events if e[0] == "reference"):
        assert all(states.values()), rest
    fresh = [(e[0], e[1]) for e in events[2:] if len(e) < 3 or e[2] == 1]
    assert fresh[:6] == [("reference", 0), ("round", "main"), ("reference", 1),
                         ("round", "round2"), ("reference", 2), ("round", "round3")]
    assert sorted(fresh[6:]) == [("close", "round2"), ("close", "round3")]
    # The case that is not launch-bound: its rounds in the submission's own process, once the
    # round processes are gone.
    assert [(e[0], e[1]) for e in events[8 + 2:]] == \
        [("reference", 0), ("round", "main")] * QUICK.rounds
    assert all(p.closed for p in processes[1:]) and not processes[0].closed


def test_a_round_that_fails_leaves_no_process_of_the_submission_open(monkeypatch):
    processes: list[_Process] = []
    with pytest.raises(Stop):
        _time(monkeypatch, processes, fail_round=1)
    # round 2's process failed; round 3's, loaded beside it, is closed too
    assert [p.name for p in processes] == ["main", "round2", "round3"]
    assert all(p.closed for p in processes[1:])


def test_the_reference_pool_starts_only_the_processes_timing_will_open(monkeypatch, tmp_path):
    from kbench.grading.timing import reference_pool
    from kbench.host import spawn

    started = []
    monkeypatch.setattr(spawn, "prestart",
                        lambda log, env, device, cpus: started.append((log.name, cpus)))
    ctx = SimpleNamespace(benchmarks=[{"n": 1}], logs=tmp_path, device=SimpleNamespace(
        type="cuda"), task=SimpleNamespace(name="level1/19_ReLU"),
        options=SimpleNamespace(rigour=QUICK), spare=None)
    pool = reference_pool.ReferencePool(ctx)
    pool.prestart(fresh=True, eager=True)
    log = "level1__19_ReLU.reference"
    assert started == [(f"{log}.round2.run.log", ()), (f"{log}.round3.run.log", ()),
                       (f"{log}.clock.run.log", ())]
    started.clear()
    ctx.spare = Spare((2, 3), 10)  # cores of its own for their starts, where the run has them
    pool.prestart(fresh=False, eager=True)  # no launch-bound case: the clock's only
    assert started == [(f"{log}.clock.run.log", (2, 3))]
    started.clear()
    pool.prestart(fresh=False, eager=False)  # graph replays: no clock either
    assert started == []


class _FailingClock:
    """The reference's clock process: its empty passes never come (``skipped``: the size is
    not timed there at all)."""

    def __init__(self, skipped: str | None = None) -> None:
        self.skips, self.failure, self.asked = [skipped], "worker killed by signal SIGKILL", 0

    def clocked_trips(self, index: int, calls: int, passes: int, wait_ms: float = 0.0
                      ) -> list[float]:
        self.asked += 1
        return []


def test_a_clock_without_kbench_s_empty_passes_is_kbench_s_failure_not_a_pass():
    # The submission's own empty passes can be padded (tests/fixtures/cpu_timing): without
    # kbench's, the clock would have nothing it can trust to subtract.
    pool = SimpleNamespace(clock=_FailingClock())
    with pytest.raises(Stop) as stopped:
        alternating._empty_trips(pool, [], 0, 50, 3)
    verdict = stopped.value.verdict
    assert verdict.status is Status.INTERNAL_ERROR and "SIGKILL" in verdict.reason
    assert pool.clock.asked == 2  # tried again in a new process first
    skipped = SimpleNamespace(clock=_FailingClock("too large for the host"))
    assert alternating._empty_trips(skipped, [], 0, 50, 3) == [] and skipped.clock.asked == 1


def test_each_round_stops_at_the_target_times_the_root_of_the_rounds():
    # A figure is the median over all its rounds' samples: each of n rounds holding its own
    # interval to the whole target took every launch-bound round to its budget.
    import math

    import torch

    from kbench.grading.context import Context
    from kbench.problems.load import load_task

    task = load_task("l2norm", "l2norm")
    for profile in (Profile.FULL, Profile.QUICK):
        ctx = SimpleNamespace(task=task, device=torch.device("cuda"), options=SimpleNamespace(
            rigour=RIGOUR[profile], timing=TimingMode.EAGER))
        one, fresh = Context.timing(ctx, 1), Context.timing(ctx, RIGOUR[profile].fresh_rounds)
        rounds = RIGOUR[profile].fresh_rounds
        assert fresh.target_ci == pytest.approx(one.target_ci * math.sqrt(rounds))
        assert fresh.budget_ms == pytest.approx(one.budget_ms / rounds)
        assert one.target_ci == pytest.approx(task.timing["cuda"].target_ci
                                              * RIGOUR[profile].target_ci)


class _Readied:
    """kbench's own work readied beside a submission (a profiling process, a torch.compile
    baseline): records when it is stopped and continued."""

    def __init__(self, name: str, events: list) -> None:
        self.name, self.events = name, events

    @contextlib.contextmanager
    def frozen(self):
        self.events.append(("stopped", self.name))
        yield
        self.events.append(("continued", self.name))


def test_kbench_s_readied_work_is_stopped_for_the_whole_of_a_submission_s_timing(monkeypatch):
    # On an H200 the torch.compile baseline's autotuning and the profiler's start, readied
    # beside the timing, ran 3.8-4.5x into honest baselines' clocked passes: flagged.
    from kbench.grading.running.submission import Slot

    events: list = []
    kernels = SimpleNamespace(channel=_Readied("kernels", events),
                              wait=lambda step: events.append(("built", step)))
    monkeypatch.setattr(alternating, "time_submission",
                        lambda *args: events.append(("timed",)))

    class Judge:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def record(self):
            return {"busy": 0}

    slot = Slot(None, None, None, readied=lambda: [_Readied("compile", events)])
    result = SimpleNamespace()
    slot._time(None, result, [], Judge(), kernels, [])
    assert events == [("built", 0), ("stopped", "compile"), ("stopped", "kernels"),
                      ("timed",), ("continued", "kernels"), ("continued", "compile")]
    assert result.timed_beside == {"busy": 0}


def test_the_reference_s_own_clocked_passes_each_get_their_input_sets(tmp_path):
    # A pass with the calls uses up the sets its Prepare made: the second of a set of the
    # reference's passes once found none, and each such failure cost its clock process (on
    # an H200 under load the third took the clock away: internal_error for a submission).
    from conftest import quick_task

    from kbench.grading.context import Context
    from kbench.grading.options import Options
    from kbench.grading.timing.reference_pool import ReferenceWorker
    from kbench.host.toolchain import Toolchain
    from kbench.problems.load import load_task

    options = Options(device="cpu", out_dir=tmp_path, cache_dir=tmp_path, jobs=1, seed=1)
    ctx = Context.create(load_task(str(quick_task(tmp_path))), options,
                         Toolchain(None, None, "9.0"))
    clock = ReferenceWorker(ctx, "l2norm.reference.clock", [None] * len(ctx.benchmarks))
    try:
        assert len(clock.clocked_trips(0, 5, 3, empty=False)) == 3
        assert len(clock.clocked_trips(0, 5, 3)) == 3
        assert clock.failure is None and clock.opened == 1
    finally:
        clock.close()
