import random

import pytest

from kbench.grading.timing import measurement
from kbench.results.run_record import Benchmark, Measurement, SubmissionResult
from kbench.results.verdict import Status
from kbench.shared.protocol import BadSamples, Samples


def wire(ms: list[float], **extra) -> dict:
    """A round of samples as a worker sends it."""
    n = len(ms)
    return {"ms": ms, "after_ms": [0.0] * n, "host_ms": [0.001] * n, "sm_mhz": [1980] * n,
            "mem_mhz": [3201] * n, "slowed": [False] * n, "max_sm_mhz": 1980,
            "idle_ms": [0.0] * n, **extra}


def samples(ms: list[float], **extra) -> Samples:
    return Samples.from_wire(wire(ms, **extra))


def noisy(rng: random.Random, centre: float, n: int = 200, spread: float = 0.01) -> list[float]:
    return [centre * (1 + abs(rng.gauss(0, spread))) for _ in range(n)]


def test_summarise_gives_median_interval_bandwidth_and_clocks():
    m = measurement.summarise([Samples.from_wire(wire(
        [1.0, 2.0, 3.0, 4.0, 5.0], slowed=[False, True, True, False, False]))], nbytes=2_000_000)
    assert (m.ms, m.ci, m.samples) == (3.0, [1.0, 5.0], 5)
    assert m.gbps == pytest.approx(2e6 / 3e-3 / 1e9)
    assert (m.sm_mhz, m.mem_mhz, m.max_sm_mhz, m.slowed) == (1980, 3201, 1980, 2)
    assert m.side_work_ms is None


def test_rounds_are_pooled():
    m = measurement.summarise([samples([1.0] * 10), samples([3.0] * 11)], None)
    assert m.samples == 21 and m.ms == 3.0 and m.gbps is None and m.fastest_ms == 1.0


@pytest.mark.parametrize("bad, message", [
    (None, "no sample lists"),
    ({"ms": [1.0]}, "no sample lists"),
    (wire([]), "no valid timings"),
    (wire([1.0, float("nan")]), "no valid timings"),
    (wire([1.0, -2.0]), "no valid timings"),
    (wire([1.0, True]), "no valid timings"),
    (wire([1.0, 2.0], slowed=[False]), "differ in length"),
    (wire([1.0, 2.0], after_ms=[0.0, float("inf")]), "device-busy or host"),
])
def test_check_refuses_what_the_stopwatch_never_sends(bad, message):
    with pytest.raises(BadSamples, match=message):
        Samples.from_wire(bad)


def test_work_left_on_other_streams_is_charged_but_jitter_is_not():
    jitter = samples([0.010] * 9, after_ms=[0.0, 0.0, 0.04, 0.0, -0.001, 0.0, 0.05, 0.0,
                                                  0.0])
    m = measurement.summarise([jitter], None)
    assert m.side_work_ms is None and m.ms == pytest.approx(0.010)  # two late syncs: jitter
    offset = samples([0.010] * 9, after_ms=[0.031] * 9, idle_ms=[0.03] * 9)
    assert measurement.summarise([offset], None).side_work_ms is None  # this process's syncs
    # Syncs that got slower mid-run (the allocator mapping memory): each sample has its probe.
    moving = samples([0.010] * 9, after_ms=[0.015] * 4 + [0.15] * 5,
                            idle_ms=[0.013] * 4 + [0.14] * 5)
    assert measurement.summarise([moving], None).side_work_ms is None
    hidden = samples([0.002] * 9, after_ms=[0.5] * 9)  # the work ran on another stream
    m = measurement.summarise([hidden], None)
    assert m.side_work_ms == pytest.approx(0.5) and m.ms == pytest.approx(0.502)
    big = samples([10.0] * 9, after_ms=[0.05] * 9)  # a sync's cost on a long call
    assert measurement.summarise([big], None).side_work_ms is None


def test_a_host_thread_preempted_before_its_probe_is_not_side_work():
    # A busy host: the thread woke late after six of nine calls (the device long idle); a
    # median took that for work left on other streams and charged it.
    late = samples([0.010] * 9, after_ms=[0.0, 2.1, 0.9, 0.0, 3.3, 1.2, 0.0, 0.7, 4.0])
    m = measurement.summarise([late], None)
    assert m.side_work_ms is None and m.ms == pytest.approx(0.010)
    # Work really left on another stream is in every sample, late wake-ups or not.
    hidden = samples([0.002] * 9, after_ms=[0.5, 2.6, 1.4, 0.5, 3.8, 1.7, 0.5, 1.2, 4.5])
    assert measurement.summarise([hidden], None).side_work_ms == pytest.approx(0.5, rel=0.1)


def test_drift_only_beyond_noise():
    rng = random.Random(3)

    def timed(centre: float) -> Measurement:
        return measurement.summarise([samples(noisy(rng, centre))], 8)

    start = timed(1.0)
    assert measurement.drift(start, timed(1.0)) is None
    text = measurement.drift(start, timed(1.05))
    assert text is not None and "+5" in text
    assert "-5" in measurement.drift(start, timed(0.95))


def m(ms: float, rel: float = 0.01) -> Measurement:
    return Measurement(ms=ms, ci=[ms * (1 - rel), ms * (1 + rel)], samples=100)


def test_speedups_per_shape_and_geometric_mean_with_intervals():
    reference = [Benchmark({"batch": 1, "dim": 1}, "float32", reference=m(2.0), compiled=m(1.0)),
                 Benchmark({"batch": 2, "dim": 2}, "float32", reference=m(8.0), compiled=m(4.0)),
                 Benchmark({"batch": 3, "dim": 3}, "float32", skipped="too big")]
    # Each speedup divides the reference's rounds taken alongside the candidate's.
    result = SubmissionResult("s", "s.py", "0", Status.OK, benchmarks=[
        Benchmark({"batch": 1, "dim": 1}, "float32", candidate=m(1.0), reference=m(2.0)),
        Benchmark({"batch": 2, "dim": 2}, "float32", candidate=m(2.0), reference=m(8.0)),
        Benchmark({"batch": 3, "dim": 3}, "float32", skipped="too big")])
    measurement.add_speedups(result, reference)
    assert [b.speedup for b in result.benchmarks[:2]] == [2.0, 4.0]
    assert result.speedup == pytest.approx(8 ** 0.5)
    low, high = result.speedup_ci
    assert low == pytest.approx(8 ** 0.5 * 0.99 / 1.01) and high == pytest.approx(
        8 ** 0.5 * 1.01 / 0.99)
    assert result.compile_speedup == pytest.approx(2 ** 0.5)


def test_no_compile_speedup_unless_every_timed_shape_has_one():
    reference = [Benchmark({"batch": 1, "dim": 1}, "float32", reference=m(2.0), compiled=m(1.0)),
                 Benchmark({"batch": 2, "dim": 2}, "float32", reference=m(8.0))]
    result = SubmissionResult("s", "s.py", "0", Status.OK, benchmarks=[
        Benchmark({"batch": 1, "dim": 1}, "float32", candidate=m(1.0), reference=m(2.0)),
        Benchmark({"batch": 2, "dim": 2}, "float32", candidate=m(2.0), reference=m(8.0))])
    measurement.add_speedups(result, reference)
    assert result.speedup == pytest.approx(8 ** 0.5) and result.compile_speedup is None
    assert result.benchmarks[0].compile_speedup == 1.0  # compiled 1 ms / candidate 1 ms


def test_no_speedup_over_the_start_of_run_reference_when_none_ran_alongside():
    # The reference's process failed at the second shape while this candidate was timed: that
    # shape gets no speedup (not one over the run's first timing), and so no overall either.
    reference = [Benchmark({"batch": 1, "dim": 1}, "float32", reference=m(2.0)),
                 Benchmark({"batch": 2, "dim": 2}, "float32", reference=m(8.0))]
    result = SubmissionResult("s", "s.py", "0", Status.OK, benchmarks=[
        Benchmark({"batch": 1, "dim": 1}, "float32", candidate=m(1.0), reference=m(2.0)),
        Benchmark({"batch": 2, "dim": 2}, "float32", candidate=m(2.0),
                  skipped="no speedup: the reference could not be timed alongside (out of "
                          "memory)")])
    measurement.add_speedups(result, reference)
    assert result.benchmarks[0].speedup == 2.0 and result.benchmarks[1].speedup is None
    assert result.speedup is None and result.speedup_ci is None


def test_on_a_loaded_host_the_interval_covers_each_side_s_fastest_over_the_other_s_median():
    from dataclasses import replace

    from kbench.reports.summary import inconclusive

    # Seen on a 2-core machine at load average 7: a copy of the reference's own expression,
    # 0.453x (0.362-0.588) on its medians, the two sides' fastest calls 1.80 and 1.84 ms.
    def timed(ms: float, fastest: float) -> Measurement:
        return replace(m(ms, 0.12), fastest_ms=fastest)

    def graded(loaded: bool) -> SubmissionResult:
        result = SubmissionResult("s", "s.py", "0", Status.OK, benchmarks=[Benchmark(
            {"batch": 1, "dim": 1}, "float32", candidate=timed(7.7, 1.80),
            reference=timed(3.49, 1.84))])
        measurement.add_speedups(result, [Benchmark({"batch": 1, "dim": 1}, "float32")], loaded)
        return result

    quiet, loaded = graded(False), graded(True)
    assert quiet.speedup == loaded.speedup == pytest.approx(0.453, abs=0.001)
    assert quiet.speedup_ci[1] < 1 and not inconclusive(quiet)  # a confident wrong figure
    low, high = loaded.speedup_ci
    assert low == pytest.approx(1.84 / 7.7) and high == pytest.approx(3.49 / 1.80)
    assert low < 1 < high and inconclusive(loaded)  # "not measurable here"


def test_a_missed_persisting_l2_reset_is_kept():
    assert measurement.summarise([samples([1.0])], None).l2_reset  # CPU: not applicable
    missed = samples([1.0], persisting_l2_reset=False)
    assert not measurement.summarise([samples([1.0]), missed], None).l2_reset


def test_work_on_another_stream_is_charged_when_the_probes_woke_late_too():
    # A busy host delays the probe after a call as often as the call's own measurement: four
    # of nine probes woke late here, and the per-sample differences' quartile fell to nothing.
    hidden = samples([0.002] * 9, after_ms=[0.5, 0.5, 1.9, 0.5, 0.5, 0.6, 0.5, 2.2, 0.5],
                     idle_ms=[0.0, 1.5, 0.0, 2.5, 0.0, 3.1, 0.0, 0.0, 1.8])
    m = measurement.summarise([hidden], None)
    assert m.side_work_ms == pytest.approx(0.5, rel=0.1) and m.ms > 0.3
    # An honest call on the same host: delays as often after the call as after the probe.
    rng = random.Random(7)
    delay = [lambda: rng.choice([0.0, 0.0, 0.0, rng.uniform(0.2, 3.0)]) for _ in range(2)]
    honest = samples([0.010] * 200, after_ms=[0.004 + delay[0]() for _ in range(200)],
                     idle_ms=[0.003 + delay[1]() for _ in range(200)])
    m = measurement.summarise([honest], None)
    assert m.side_work_ms is None and m.ms == pytest.approx(0.010)
