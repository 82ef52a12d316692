import math
import random
import time

import pytest
import torch

from kbench.shared import stats
from kbench.worker.timing import measure, rotation


def test_estimate_brackets_the_median():
    est = stats.estimate([5.0, 1.0, 3.0, 2.0, 4.0])
    assert est.median == 3.0 and (est.low, est.high) == (1.0, 5.0)  # n < 6: the whole range
    est = stats.estimate([float(i) for i in range(1, 101)])
    assert est.median == 50.5 and est.samples == 100
    assert (est.low, est.high) == (40.0, 61.0)  # ranks 50 -/+ 1.96 * 5, the usual table values
    with pytest.raises(ValueError):
        stats.estimate([])


def test_interval_covers_the_true_median_about_95_percent():
    rng = random.Random(7)
    true_median = math.exp(0.0)  # lognormal(0, 0.5): skewed, like timing noise
    covered = 0
    for _ in range(400):
        est = stats.estimate([rng.lognormvariate(0.0, 0.5) for _ in range(60)])
        covered += est.low <= true_median <= est.high
    assert 0.90 <= covered / 400 <= 0.99


def test_converged_only_when_precise():
    rng = random.Random(1)
    tight = [1.0 + rng.gauss(0, 0.002) for _ in range(50)]
    loose = [1.0 + rng.gauss(0, 0.1) for _ in range(50)]
    assert stats.converged(tight, 0.005)
    assert not stats.converged(loose, 0.005)
    assert stats.converged(loose * 40, 0.005)  # more samples, narrower interval


def test_ratio_and_geomean_bounds():
    ref = stats.Estimate(2.0, 1.9, 2.1, 100)
    cand = stats.Estimate(1.0, 0.95, 1.05, 100)
    value, low, high = stats.ratio(ref, cand)
    assert value == 2.0 and low == pytest.approx(1.9 / 1.05) and high == pytest.approx(2.1 / 0.95)
    assert stats.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.geomean([]) is None
    with pytest.raises(ValueError):
        stats.geomean([1.0, 0.0])


_clock = time.perf_counter  # bound here: one test patches time.perf_counter


def spin(seconds: float):
    def call(args):
        end = _clock() + seconds
        while _clock() < end:
            pass
    return call


def no_inputs(i: int) -> list:
    return []


def test_measure_stops_when_converged_before_the_budget():
    start = time.perf_counter()
    samples, _ = measure(spin(0.001), no_inputs, torch.device("cpu"), warmup_ms=5,
                         min_samples=10, max_samples=10_000, budget_ms=20_000, target_ci=0.05)
    assert time.perf_counter() - start < 10  # far inside the 20 s budget
    assert 10 <= len(samples.ms) < 10_000
    assert stats.estimate(samples.ms).median == pytest.approx(1.0, rel=0.5)  # milliseconds
    lists = (samples.after_ms, samples.idle_ms, samples.sm_mhz, samples.slowed)
    assert all(len(v) == len(samples.ms) for v in lists)
    assert samples.sm_mhz[0] is None  # no clocks on a CPU


def test_measure_respects_min_max_and_budget():
    cpu = torch.device("cpu")
    assert len(measure(spin(0.0005), no_inputs, cpu, warmup_ms=0, min_samples=7, max_samples=7,
                       budget_ms=10_000, target_ci=1e-9)[0].ms) == 7
    start = time.perf_counter()
    samples, _ = measure(spin(0.002), no_inputs, cpu, warmup_ms=0, min_samples=3,
                         max_samples=100_000, budget_ms=200, target_ci=1e-9)  # never converges
    assert time.perf_counter() - start < 5 and len(samples.ms) >= 3


def test_every_timed_call_gets_a_fresh_input_set_made_outside_the_clock():
    made, seen = [], []

    def inputs(i: int) -> list:
        made.append(i)
        time.sleep(0.005)  # slow to make: must not show in the samples
        return [torch.full((4,), float(i))]

    def call(args):
        seen.append(int(args[0][0]))

    samples, _ = measure(call, inputs, torch.device("cpu"), warmup_ms=0, min_samples=20,
                         max_samples=20, budget_ms=10_000, target_ci=1e-9)
    timed = seen[-20:]
    assert len(set(timed)) == 20 and 0 not in timed  # never the warm-up set, never twice
    # The 5 ms spent making inputs is outside every sample: inside, every sample would take
    # 5 ms; a sample the host's scheduler delays once (another process on the cores) may.
    assert sum(ms >= 5 for ms in samples.ms) <= 2, samples.ms


def test_calls_rotate_over_buffers_and_outputs_are_kept_to_verify():
    made, outputs = {}, {}

    def inputs(i: int) -> list:
        made[i] = torch.full((1 << 18,), float(i))  # 1 MiB a set: 96 sets rotate on a CPU
        return [made[i]]

    def call(args):
        out = args[0] * 2
        outputs[int(args[0][0])] = out
        return out

    samples, kept = measure(call, inputs, torch.device("cpu"), warmup_ms=0, min_samples=300,
                            max_samples=300, budget_ms=60_000, target_ci=1e-9)
    assert rotation(1 << 20, torch.device("cpu")) == 96
    addresses = {made[i].data_ptr() for i in range(1, 301)}
    assert len(addresses) >= 90  # not the one buffer a freed-and-remade set would reuse
    assert samples.kept == sorted(kept) and 300 in kept and 299 in kept
    assert 96 <= len(kept) <= 97  # the latest 96, and one earlier call picked at random
    for index, (out, norm) in kept.items():
        assert out is outputs[index] and torch.equal(out, made[index] * 2)
        assert norm == pytest.approx(float(torch.linalg.vector_norm(out)))


def test_the_stopwatch_ignores_a_patched_clock(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)  # what a submission might do
    samples, _ = measure(spin(0.001), no_inputs, torch.device("cpu"), warmup_ms=0,
                         min_samples=5, max_samples=5, budget_ms=10_000, target_ci=1e-9)
    assert min(samples.ms) > 0.5


def test_graph_mode_needs_cuda():
    with pytest.raises(ValueError, match="graph"):
        measure(spin(0), no_inputs, torch.device("cpu"), warmup_ms=0, min_samples=1,
                max_samples=1, budget_ms=10, target_ci=0.1, mode="graph")


def test_disagree_is_disjoint_intervals():
    a = stats.Estimate(1.00, 0.99, 1.01, 50)
    assert not stats.disagree(a, stats.Estimate(1.005, 1.0, 1.02, 50))  # overlap: noise
    assert stats.disagree(a, stats.Estimate(1.03, 1.02, 1.04, 50))
    assert stats.disagree(stats.Estimate(1.03, 1.02, 1.04, 50), a)
