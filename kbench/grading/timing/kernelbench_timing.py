"""Each timed case's speedup as KernelBench's evaluator computes it, beside kbench's: the mean
of its trials after its warm-up calls, timed in the submission's own process (as KernelBench
times a generated kernel where it loaded it) and in the reference's, the submission stopped
meanwhile. Users compare kbench's figures with papers that used KernelBench's timing; this
puts both on one page. It is evidence of agreement, not of trust: no fresh inputs, no flush,
no hold, a mean not a median, and the submission's process reports its own times (see
kbench.worker.trials)."""

from __future__ import annotations

import statistics

from kbench.grading.channel import Channel
from kbench.grading.context import Context
from kbench.grading.timing.reference_pool import ReferenceWorker
from kbench.results.run_record import Benchmark, SubmissionResult
from kbench.shared import protocol
from kbench.shared.stats import geomean

# KernelBench's src/eval.py: time_execution_with_cuda_event's num_warmup (3) and
# eval_kernel_against_ref's num_perf_trials (100).
WARMUP = 3
TRIALS = 100


def time_case(ctx: Context, channel: Channel, reference: ReferenceWorker, index: int,
              bench: Benchmark) -> None:
    """``bench``'s KernelBench figures: the reference's mean, the submission's, their ratio
    (None where the reference could not be timed). Under a profile of budgeted trials
    (kbench.grading.options.Rigour) each side's trials stop at its time budget."""
    dtype = ctx.task.benchmark_dtype
    budget = ctx.timing(1).budget_ms if ctx.options.rigour.budgeted_trials else None
    request = protocol.TimeTrials(params=bench.params, dtype=dtype,
                                  distribution=ctx.distribution,
                                  model=ctx.spec(bench.params, dtype), warmup=WARMUP,
                                  trials=TRIALS, budget_ms=budget)
    with channel.frozen():  # the submission does not run while the reference is timed
        theirs = reference.trials(index, request)
    mine = channel.call(request, ctx.task.limits.benchmark_s,
                        "benchmark (timed as KernelBench times)").ms
    bench.kernelbench_ms = statistics.fmean(mine) if mine else None
    bench.kernelbench_trials = len(mine) or None
    bench.kernelbench_reference_ms = statistics.fmean(theirs) if theirs else None
    if bench.kernelbench_ms and bench.kernelbench_reference_ms:
        bench.kernelbench_speedup = bench.kernelbench_reference_ms / bench.kernelbench_ms


def overall(result: SubmissionResult) -> None:
    """The submission's KernelBench speedup: the geometric mean over its timed cases, where
    each has one (a problem file usually has one: its own sizes)."""
    figures = [b.kernelbench_speedup for b in result.benchmarks if b.candidate is not None]
    if figures and all(f is not None for f in figures):
        result.kernelbench_speedup = geomean(figures)
