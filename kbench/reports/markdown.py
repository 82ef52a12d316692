"""A RunResult as Markdown: progress lines and leaderboard.md (report_folder.py writes it with
the other formats)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

from kbench.grading.options import profile_text
from kbench.host.peaks import peak_tflops
from kbench.reports.summary import (
    INCONCLUSIVE,
    THRESHOLDS,
    degenerate_counts,
    inconclusive,
    not_run,
    rank_key,
    summarise,
)
from kbench.results.run_record import (
    LAUNCH_BOUND_MS,
    Benchmark,
    Measurement,
    ProblemRun,
    RunResult,
    SubmissionResult,
    ms_text,
    params_text,
)
from kbench.results.verdict import Status

_CLOCK = {
    "cuda": "CUDA events around each call plus any time the device stays busy after them "
            "(work left on other streams is the call's)",
    "cpu": "wall clock around each call",
}
_MODE = {
    ("eager", "cuda"): "eager: one call per sample, queued behind a short spin kernel that "
                       "fills every SM, so the interval is the device's time for the call "
                       "(kernel launch gaps included, the host's Python dispatch not: "
                       "results.json has it as host_ms); calls rotate over input sets and "
                       "outputs >= 3x L2",
    ("eager", "cpu"): "eager: one call per sample; calls rotate over input sets and outputs",
    ("graph", "cuda"): "graph: each sample replays a CUDA graph of many calls on rotating "
                       "inputs (>= 3x L2) and is divided by the calls; host launch overhead "
                       "excluded",
}


def progress_line(result: SubmissionResult, index: int, total: int) -> str:
    if result.status is Status.OK:
        speed = _speedup(result.speedup, result.speedup_ci)
        detail = f"{speed}, {result.cases_passed}/{result.cases_total} cases"
    else:
        detail = result.reason
    return f"[{index}/{total}] {result.name}: {result.status.value} - {detail}"


def _shape(b: Benchmark) -> str:
    return params_text(b.params)


def _interval(bounds: list[float] | None, digits: int = 4) -> str:
    return f"{bounds[0]:.{digits}g}-{bounds[1]:.{digits}g}" if bounds else "-"


def _speedup(value: float | None, bounds: list[float] | None) -> str:
    return f"{value:.3f}x ({_interval(bounds)})" if value else "-"


def _bandwidth(m: Measurement | None, copy_gbps: float | None, b: Benchmark,
               device: str) -> str:
    """Achieved GB/s (share of the measured copy bandwidth) and, where the work has matrix
    FLOPs, TFLOP/s (share of the device's peak for the dtype, where kbench.host.peaks knows it)."""
    if m is None or m.gbps is None:
        return "-"
    share = f" ({100 * m.gbps / copy_gbps:.0f}%)" if copy_gbps else ""
    if not b.flops:
        return f"{m.gbps:.0f} GB/s{share}"
    tflops = b.flops / (m.ms * 1e-3) / 1e12
    peak = peak_tflops(device, b.dtype)
    of_peak = f" ({100 * tflops / peak:.0f}%)" if peak else ""
    return f"{m.gbps:.0f} GB/s{share}, {tflops:.3g} TFLOP/s{of_peak}"


def _clocks(m: Measurement | None) -> str:
    if m is None or m.sm_mhz is None:
        return "-"
    text = f"{m.sm_mhz:.0f}/{m.mem_mhz:.0f}" if m.mem_mhz is not None else f"{m.sm_mhz:.0f}"
    return text + (f", slowed on {m.slowed}" if m.slowed else "")


def leaderboard(run: RunResult, images: dict[str, list[str]] | None = None) -> str:
    """The run in Markdown; ``images`` (problem name, or "" for the run, -> chart files
    relative to the leaderboard) are shown where they belong."""
    images = images or {}
    bound = set().union(*(run.launch_bound(p) for p in run.problems))
    lines = [f"# kbench leaderboard: {run.task}", "", *_header(run, bound)]
    if len(run.problems) > 1:
        lines += ["", "## Summary", "", *_summary(run), *_images(images.get("", []))]
    for problem in run.problems:
        subs = [s for s in run.submissions if s.problem == problem.name]
        lines += _problem(run, problem, subs, len(run.problems) > 1)
        lines += _images(images.get(problem.name, []))
    lines += ["", "Full compiler and run output: logs/NAME.build.log and logs/NAME.run.log "
              "beside this file; `kbench grade FILE --seed S --case K` (in results.json under "
              "failure.reproduce) repeats a failing case."]
    return "\n".join(lines) + "\n"


def console(run: RunResult, width: int) -> str:
    """What a grade of one problem prints when it ends (its lines as they came were its
    verdicts): each correct submission ranked, each other with its verdict, a line each, cut
    to ``width`` characters; leaderboard.md has the rest."""
    lines = [f"**Not run here**: {skipped}"] if (skipped := not_run(run)) else []
    for problem in run.problems:
        subs = [s for s in run.submissions if s.problem == problem.name]
        ok = _ranked(subs)
        lines.append(f"{problem.name}: {len(ok)} of {len(subs)} correct"
                     + (f"; problem error: {problem.error}" if problem.error else ""))
        lines += [f"  {rank}. {sub.name}: {_overall(sub)}"
                  + (f", vs compile {_speedup(sub.compile_speedup, sub.compile_speedup_ci)}"
                     if sub.compile_speedup else "") + (f" [{_labels(sub)}]" if labels(sub)
                                                         else "")
                  for rank, sub in enumerate(ok, 1)]
        lines += [f"  {sub.name}: {sub.status.value} - {' '.join(sub.reason.split())}"
                  for sub in subs if sub.status is not Status.OK]
    return "\n".join(line if len(line) <= width else line[:width - 3] + "..."
                     for line in lines) + "\n"


def _problem(run: RunResult, problem: ProblemRun, subs: list[SubmissionResult],
             titled: bool) -> list[str]:
    """One problem's section: its notes, reference, ranked and other submissions."""
    bound = run.launch_bound(problem)

    def shape_name(b: Benchmark) -> str:
        return _shape(b) + (" †" if _shape(b) in bound else "")

    level = "###" if titled else "##"
    lines = ["", f"## {problem.name}"] if titled else []
    if problem.error:
        return lines + ["", f"**Problem error** (its {len(subs)} submission(s) are "
                        f"task_error): {problem.error}"]
    lines += [""] + [f"- note: {note}" for note in problem.notes] if problem.notes else []
    if problem.degenerate:
        lines += ["", f"**Degenerate** ({degenerate_counts(run)}): {problem.degenerate}"]
    if problem.reference:
        lines += ["", f"{level} Reference", "", _reference_table(problem, run.copy_gbps,
                                                                 device_text(run), shape_name)]
    lines += ["", f"{level} Ranked", "", _ranked_table(run, subs, problem, shape_name)]
    sizes = _sizes_table(run, subs, shape_name)
    if sizes:
        lines += ["", f"{level} Per size", "", sizes]
    failed = [s for s in subs if s.status is not Status.OK]
    if failed:
        lines += ["", f"{level} Not ranked", "",
                  tabulate([[s.name, s.status.value, f"{s.cases_passed}/{s.cases_total}",
                             _one_line(s.reason, _SHORT), _labels(s)] for s in failed],
                           headers=["submission", "verdict", "cases", "reason", "flags"],
                           tablefmt="github")]
        long = [s for s in failed if len(_one_line(s.reason)) > _SHORT]
        lines += ["", "Reasons in full:", ""] + [f"- {s.name}: {_one_line(s.reason, 2000)}"
                                                 for s in long] if long else []
    return lines


def _images(paths: list[str]) -> list[str]:
    return [""] + [f"![{Path(p).stem}]({p})" for p in paths] if paths else []


def _summary(run: RunResult) -> list[str]:
    s = summarise(run)
    share = " | ".join
    lines = [f"{s.problems} problem(s) graded ({s.problem_errors} more could not be: problem "
             f"error{s.apart()}), {s.submissions} submission(s): "
             + ", ".join(f"{n} {v}" for v, n in sorted(s.counts.items())),
             f"- correct: {s.correct}/{s.problems} problems ({100 * s.correct_rate:.0f}%); "
             "geometric-mean speedup of each problem's best: "
             + (f"{s.geomean:.3f}x" if s.geomean else "-")]
    lines += _kernelbench_summary(run)
    if s.timing_s is not None:
        where = "on the CPU" if run.environment.get("device") == "cpu" else "on its GPU"
        lines.append(f"- timing: {s.timing_s:.1f} s per timed submission {where} ("
                     + ", ".join(f"{k} {v:.1f} s" for k, v in s.timing_parts.items())
                     + "), reference timing at each problem's start and end apart")
    if s.inconclusive:
        lines.append(f"- timings inconclusive for {len(s.inconclusive)} correct "
                     f"submission(s) (95% interval wider than a factor of {INCONCLUSIVE:g}: "
                     "ranked after clear figures by their lower bound, left out of the "
                     "median-based fast_p and the geometric mean): "
                     + ", ".join(s.inconclusive))
    if s.geomean is None and not s.inconclusive:
        return lines + ["- fast_p: no correct submission was timed"]
    lines += ["", "| fast_p (share of problems) | " + share(f"p={p:g}" for p in THRESHOLDS)
              + " |", "|---|" + "---|" * len(THRESHOLDS)]
    for label, values in (("vs eager, lower bound of the 95% interval > p", s.fast),
                          ("vs eager, median > p (KernelBench's fast_p; inconclusive "
                           "timings not counted)", s.fast_plain),
                          ("vs torch.compile, lower bound > p", s.fast_compile),
                          ("vs eager as KernelBench times (mean of its trials) > p",
                           s.fast_kernelbench)):
        lines.append(f"| {label} | " + share(f"{100 * values[p]:.1f}%" if values else
                                             "not timed" for p in THRESHOLDS) + " |")
    return lines


def _kernelbench_summary(run: RunResult) -> list[str]:
    """The same run under KernelBench's rules: correct rate and KernelBench's fast_p (on the
    median), where its problems are KernelBench problem files."""
    kb_run = run.under_kernelbench()
    if kb_run is None:
        return []
    s = summarise(kb_run)
    ranks = "rank this run" if run.rules == "kernelbench" else \
        "do not rank this run; what failed kbench's was not timed, so it is never fast here"
    fast = ("; fast_p on the median: " + ", ".join(
        f"p={p:g} {100 * s.fast_plain[p]:.1f}%" for p in THRESHOLDS)) if s.geomean else ""
    return [f"- under KernelBench's rules ({ranks}): correct {s.correct}/{s.problems} problems "
            f"({100 * s.correct_rate:.0f}%){fast}"]


def _header(run: RunResult, bound: set[str]) -> list[str]:
    """The machine, the run, how it was timed, and every note."""
    env = run.environment
    device = env.get("device_name", env.get("device"))
    lines = [f"**Not run here**: {skipped}", ""] if (skipped := not_run(run)) else []
    if env.get("problems"):
        lines += ["**This machine has environment problems** (`kbench doctor` checks again; "
                  "submissions they prevented are `environment_error`, not their fault):", "",
                  *(f"- {problem}" for problem in env["problems"]), ""]
    lines += [f"- device: {device} ({env.get('device')}), torch {env.get('torch')}, "
             f"CUDA {env.get('torch_cuda')}, driver {env.get('driver', '-')}, "
             f"nvcc {env.get('nvcc') or '-'}",
             f"- kbench {run.kbench_version}, run {run.run_id}, seed {run.seed}, "
             f"started {run.started}",
             f"- profile {run.profile} ({profile_text(run.profile)}); timing "
             f"{_MODE.get((run.timing_mode, env.get('device')), run.timing_mode)}; "
             f"{_CLOCK.get(env.get('device'), 'clock unknown')}; fresh input values for "
             "every call, caches flushed before each sample; sampling stops when the median's "
             "95 % interval is within the task's target or its time budget is spent",
             "- speedup = reference median / submission median per shape; overall = geometric "
             "mean over timed shapes; intervals are 95 % for medians, and bound the speedup "
             "while both medians lie in theirs. The reference runs in its own process, which "
             "never loads a submission: timed at the start and the end of the run (the table "
             "below; disagreement beyond noise is reported as drift) and in rounds alternating "
             "with each submission's (what its speedups divide; in eager mode, shapes under the "
             "task's fresh_rounds_below_ms take each round in new processes on both sides; "
             "\"reference\" beside a submission's median is those rounds'); \"vs compile\" "
             "divides torch.compile of the reference, timed once"]
    if split := env.get("host_split"):
        lines.append(f"- host cores: {split['text']}")
    if bound:
        lines.append(f"- launch-bound (marked †, reference under {LAUNCH_BOUND_MS * 1e3:.0f} us): "
                     "these figures include the device's per-kernel launch gaps, which can "
                     "dominate; `--timing graph` measures the kernels alone")
    if run.copy_gbps:
        copy = "device to device" if env.get("device") == "cuda" else "in host memory"
        lines.append(f"- copy bandwidth ({copy}, read + write, this run): "
                     f"{run.copy_gbps:.0f} GB/s; achieved GB/s count the task's minimum traffic "
                     "(in brackets: the share of that copy bandwidth), TFLOP/s the reference's "
                     "counted FLOPs (in brackets: the share of the device's peak)")
    references = [b for problem in run.problems for b in problem.reference]
    if any(b.reference is not None and not b.reference.l2_reset for b in references):
        lines.append("- note: persisting L2 lines could not be reset before samples (no CUDA "
                     "runtime library found by name); the L2 flush still ran")
    if any(b.reference is not None and b.reference.exclusive_hold is False
           for b in references):
        lines.append("- note: the hold kernel that fills every SM could not be loaded (CUDA "
                     "driver API); a one-thread spin stood in, so work on a stream that does "
                     "not wait for the caller's could run before the start event (kbench's "
                     "own clock still bounds it)")
    lines += [f"- note: {note}" for note in run.notes]
    return lines


def device_text(run: RunResult) -> str:
    return str(run.environment.get("device_name", ""))


def _reference_table(problem: ProblemRun, copy_gbps: float | None, device: str,
                     shape_name: Callable[[Benchmark], str]) -> str:
    rows = [[shape_name(b), b.dtype,
             f"{ms_text(b.reference)} ({_interval(b.reference and b.reference.ci)})",
             b.reference.samples if b.reference else 0,
             _bandwidth(b.reference, copy_gbps, b, device), ms_text(b.compiled),
             _clocks(b.reference), b.skipped or (f"drifted: {b.drift}" if b.drift else "")]
            for b in problem.reference]
    headers = ["shape", "dtype", "median (95% interval)", "samples", "achieved",
               "torch.compile", "SM/mem MHz", "note"]
    keep = [k for k, name in enumerate(headers)  # no note, no clocks read (a CPU): no column
            if name not in ("SM/mem MHz", "note") or any(row[k] not in ("", "-") for row in rows)]
    return tabulate([[row[k] for k in keep] for row in rows],
                    headers=[headers[k] for k in keep], tablefmt="github")


def _ranked(subs: list[SubmissionResult]) -> list[SubmissionResult]:
    """The correct submissions, best first (kbench.reports.summary.rank_key: inconclusive
    timings after clear ones)."""
    return sorted([s for s in subs if s.status is Status.OK], key=rank_key)


def _overall(sub: SubmissionResult) -> str:
    """A ranked submission's speedup, said to be not measurable where it is inconclusive."""
    text = _speedup(sub.speedup, sub.speedup_ci)
    return f"not measurable here: {text}" if inconclusive(sub) else text


def _ranked_table(run: RunResult, subs: list[SubmissionResult], problem: ProblemRun,
                  shape_name: Callable[[Benchmark], str]) -> str:
    ranked = _ranked(subs)
    if not ranked:
        return "No submission passed every correctness case."
    profiled = any(sub.custom_share is not None for sub in ranked)  # a GPU run
    return tabulate([[rank, sub.name, _overall(sub),
                      _speedup(sub.compile_speedup, sub.compile_speedup_ci),
                      f"{sub.cases_passed}/{sub.cases_total}",
                      *([_share(sub)] if profiled else []), _labels(sub)]
                     for rank, sub in enumerate(ranked, 1)],
                    headers=["#", "submission", "speedup (95% interval)", "vs compile", "cases",
                             *(["own kernels"] if profiled else []), "flags"],
                    tablefmt="github")


def _share(sub: SubmissionResult) -> str:
    """The share of GPU time in the submission's own kernels
    (kbench.grading.checking.custom_kernels)."""
    return f"{sub.custom_share:.0%}" if sub.custom_share is not None else "-"


def _sizes_table(run: RunResult, subs: list[SubmissionResult],
                 shape_name: Callable[[Benchmark], str]) -> str:
    """Each ranked submission's figures per benchmark size, a row each."""
    ranked = _ranked(subs)
    device = device_text(run)
    rows = [[sub.name, shape_name(b), _speedup(b.speedup, b.speedup_ci), ms_text(b.candidate),
             ms_text(b.reference), _bandwidth(b.candidate, run.copy_gbps, b, device)]
            if b.speedup else
            [sub.name, shape_name(b), f"skipped: {_one_line(b.skipped or '', _SHORT)}", "", "",
             ""] for sub in ranked for b in sub.benchmarks]
    return tabulate(rows, headers=["submission", "size", "speedup (95% interval)", "median",
                                   "reference", "achieved"],
                    tablefmt="github") if rows else ""


def _labels(sub: SubmissionResult) -> str:
    return ", ".join(labels(sub))


def labels(sub: SubmissionResult) -> list[str]:
    """What every report says beside a submission, the disturbance of its timing first:
    notes on its figures, then the facts about its source (flags)."""
    timed = [b.candidate for b in sub.benchmarks if b.candidate is not None]
    side = [f"{_shape(b)} +{b.candidate.side_work_ms:.3g} ms" for b in sub.benchmarks
            if b.candidate is not None and b.candidate.side_work_ms]
    slowed = sum(m.slowed for m in timed)
    beside = sub.timed_beside
    notes = [f"timed on a disturbed host ({'; '.join(beside.said())})"] \
        if beside is not None and (beside.disturbed or beside.notes) else []
    notes += [f"reused from run {sub.reused_from_run}"] if sub.reused_from_run else []
    notes += [doubt] if (doubt := inconclusive(sub)) else []
    notes += [f"work left on other streams, charged: {'; '.join(side)}"] if side else []
    notes += [f"clocks slowed on {slowed} samples"] if slowed else []
    return [*notes, *sub.flags]


# A reason in a table row is cut to this many characters (in full below the table).
_SHORT = 60


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split()).replace("|", "\\|")
    return line if len(line) <= limit else line[: limit - 3] + "..."
