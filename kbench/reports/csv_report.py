"""results.csv: one row per submission and benchmark size (one row, sizes empty, for a
submission without timings), for pandas or a spreadsheet. Times in ms, rates in GB/s and
TFLOP/s, intervals 95 %; an empty cell is a figure that does not exist.

Columns, in order:
    run_id, profile, problem, submission, backend, status  -- the run, its timing profile
                       (full or quick: how much evidence every figure of the row rests on),
                       names, the kernel language (cuda, triton, cute_dsl, tilelang, pytorch)
                       and the verdict
    reason             the verdict's reason (empty for ok)
    rules              whose correctness rules ``status`` follows: kbench or kernelbench
    kernelbench_status, kernelbench_reason  -- the verdict under KernelBench's rules (empty
                       for a task of kbench's own format)
    cases_passed, cases_total
    custom_share       of a profiled call's GPU time, the share in the submission's own
                       kernels (0-1; CUDA only); kernels: the longest-running, ';'-joined
    speedup, speedup_low, speedup_high   -- the submission's overall (geometric mean)
    size               the benchmark's sizes as name=value pairs joined by ';'
    dtype
    size_speedup, size_speedup_low, size_speedup_high          -- over eager, this size
    size_compile_speedup, size_compile_low, size_compile_high  -- over torch.compile
    ms, ms_low, ms_high        the submission's median time per call
    reference_ms               the eager reference's median, in rounds alternating with it
    gbps, copy_gbps            achieved bandwidth; the run's measured copy bandwidth
    tflops                     achieved FLOP/s (where the work has matrix FLOPs)
    skipped                    why this size was not timed
    kernelbench_speedup, kernelbench_ms, kernelbench_reference_ms  -- this size timed as
                       KernelBench's evaluator times (the mean of its trials, in each side's
                       own process): beside kbench's median and interval, never ranking
    disturbed          the host was disturbed while the submission was timed (other kbench
                       builds or timings beside it, or busy cores); disturbance: what ran
                       beside it, whether it was timed again alone, and any "timing
                       disturbed" note
    flags, sha256, path
"""

from __future__ import annotations

import csv
import io

from kbench.results.run_record import Benchmark, RunResult, SubmissionResult

COLUMNS = ("run_id", "profile", "problem", "submission", "backend", "status", "reason",
           "rules", "kernelbench_status", "kernelbench_reason",
           "cases_passed", "cases_total", "custom_share", "kernels",
           "speedup", "speedup_low", "speedup_high", "size", "dtype", "size_speedup",
           "size_speedup_low", "size_speedup_high", "size_compile_speedup",
           "size_compile_low", "size_compile_high", "ms", "ms_low", "ms_high",
           "reference_ms", "gbps", "copy_gbps", "tflops", "skipped", "kernelbench_speedup",
           "kernelbench_ms", "kernelbench_reference_ms", "disturbed", "disturbance", "flags",
           "sha256", "path")


def table(run: RunResult) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for sub in run.submissions:
        for bench in sub.benchmarks or [None]:
            writer.writerow(_row(run, sub, bench))
    return buffer.getvalue()


def _row(run: RunResult, sub: SubmissionResult, b: Benchmark | None) -> dict:
    row = {"run_id": run.run_id, "profile": run.profile, "problem": sub.problem,
           "submission": sub.name, "backend": sub.backend,
           "status": sub.status.value, "reason": sub.reason, "rules": run.rules,
           "kernelbench_status": sub.kernelbench.status.value if sub.kernelbench else None,
           "kernelbench_reason": sub.kernelbench.reason if sub.kernelbench else None,
           "cases_passed": sub.cases_passed,
           "cases_total": sub.cases_total, "custom_share": sub.custom_share,
           "kernels": ";".join(sub.kernels), "speedup": sub.speedup,
           **_bounds("speedup", sub.speedup_ci), "flags": ";".join(sub.flags),
           "sha256": sub.sha256, "path": sub.path, "copy_gbps": run.copy_gbps,
           **_beside(sub)}
    if b is None:
        return row
    m = b.candidate
    row.update({"size": ";".join(f"{k}={v}" for k, v in b.params.items()), "dtype": b.dtype,
                "size_speedup": b.speedup, **_bounds("size_speedup", b.speedup_ci),
                "size_compile_speedup": b.compile_speedup,
                **_bounds("size_compile", b.compile_speedup_ci),
                "reference_ms": b.reference.ms if b.reference else None,
                "skipped": b.skipped, "kernelbench_speedup": b.kernelbench_speedup,
                "kernelbench_ms": b.kernelbench_ms,
                "kernelbench_reference_ms": b.kernelbench_reference_ms})
    if m is not None:
        row.update({"ms": m.ms, "ms_low": m.ci[0], "ms_high": m.ci[1], "gbps": m.gbps,
                    "tflops": b.flops / (m.ms * 1e-3) / 1e12 if b.flops else None})
    return row


def _bounds(name: str, ci: list[float] | None) -> dict:
    low, high = ci or (None, None)
    return {f"{name}_low": low, f"{name}_high": high}


def _beside(sub: SubmissionResult) -> dict:
    t = sub.timed_beside
    if t is None:
        return {}
    return {"disturbed": t.disturbed, "disturbance": "; ".join(t.said())}
