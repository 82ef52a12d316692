"""Render a RunResult: progress lines, the leaderboard (Markdown) and results.json."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from tabulate import tabulate

from kbench.results import Benchmark, RunResult, SubmissionResult
from kbench.verdict import Status

_CLOCK = {"cuda": "CUDA events, device synchronised after each call", "cpu": "wall clock"}


def progress_line(result: SubmissionResult, index: int, total: int) -> str:
    if result.status is Status.OK:
        speed = _speedup(result.speedup, result.speedup_ci)
        detail = f"{speed}, {result.cases_passed}/{result.cases_total} cases"
    else:
        detail = result.reason
    return f"[{index}/{total}] {result.name}: {result.status.value} - {detail}"


def _shape(b: Benchmark) -> str:
    return "x".join(str(d) for d in b.shape)


def _ms(value: float | None) -> str:
    return f"{value:.4g} ms" if value is not None else "-"


def _interval(bounds: list[float] | None, digits: int = 4) -> str:
    return f"{bounds[0]:.{digits}g}-{bounds[1]:.{digits}g}" if bounds else "-"


def _speedup(value: float | None, bounds: list[float] | None) -> str:
    return f"{value:.3f}x ({_interval(bounds)})" if value else "not timed"


def _bandwidth(gbps: float | None, copy_gbps: float | None) -> str:
    if gbps is None:
        return "-"
    share = f" ({100 * gbps / copy_gbps:.0f}% of copy)" if copy_gbps else ""
    return f"{gbps:.0f} GB/s{share}"


def _ranked(run: RunResult) -> list[SubmissionResult]:
    ok = [s for s in run.submissions if s.status is Status.OK]
    return sorted(ok, key=lambda s: -(s.speedup or 0.0))


def leaderboard(run: RunResult) -> str:
    env = run.environment
    device = env.get("device_name", env.get("device"))
    lines = [f"# kbench leaderboard: {run.task}", "",
             f"- device: {device} ({env.get('device')}), torch {env.get('torch')}, "
             f"CUDA {env.get('torch_cuda')}, driver {env.get('driver', '-')}, "
             f"nvcc {env.get('nvcc') or '-'}",
             f"- kbench {run.kbench_version}, run {run.run_id}, seed {run.seed}, "
             f"started {run.started}",
             "- speedup = reference median / submission median per shape "
             f"({_CLOCK.get(env.get('device'), 'clock unknown')}, one call at a time, "
             "cache flushed before each, launch overhead included); overall = geometric mean "
             "over timed shapes; intervals are 95 % for medians, and bound the speedup while "
             "both medians lie in theirs"]
    if run.copy_gbps:
        lines.append(f"- copy bandwidth (device to device, read + write, this run): "
                     f"{run.copy_gbps:.0f} GB/s; achieved GB/s count the task's minimum traffic")
    lines += [f"- note: {note}" for note in run.notes]
    if run.reference:
        lines += ["", "## Reference", "",
                  tabulate([[_shape(b), b.dtype, _ms(b.ref_ms), _interval(b.ref_ci),
                             b.ref_samples, _bandwidth(b.ref_gbps, run.copy_gbps),
                             b.skipped or ""] for b in run.reference],
                           headers=["shape", "dtype", "median", "95% interval (ms)", "samples",
                                    "achieved", "skipped"], tablefmt="github")]

    ranked = _ranked(run)
    shapes = list(dict.fromkeys(_shape(b) for s in ranked for b in s.benchmarks))
    lines += ["", "## Ranked", ""]
    if ranked:
        rows = []
        for rank, sub in enumerate(ranked, 1):
            cells = {_shape(b): (f"{_speedup(b.speedup, b.speedup_ci)}, {_ms(b.ms)}, "
                                 f"{_bandwidth(b.gbps, run.copy_gbps)}" if b.speedup
                                 else f"skipped: {b.skipped}") for b in sub.benchmarks}
            speed = _speedup(sub.speedup, sub.speedup_ci)
            rows.append([rank, sub.name, speed, f"{sub.cases_passed}/{sub.cases_total}",
                         *(cells.get(s, "-") for s in shapes), _labels(sub)])
        lines.append(tabulate(rows, headers=["#", "submission", "speedup", "cases", *shapes,
                                             "flags"], tablefmt="github"))
    else:
        lines.append("No submission passed every correctness case.")

    failed = [s for s in run.submissions if s.status is not Status.OK]
    if failed:
        lines += ["", "## Not ranked", "",
                  tabulate([[s.name, s.status.value, f"{s.cases_passed}/{s.cases_total}",
                             _one_line(s.reason), _labels(s)] for s in failed],
                           headers=["submission", "verdict", "cases", "reason", "flags"],
                           tablefmt="github"),
                  "", "Full compiler and run output: logs/NAME.build.log and logs/NAME.run.log "
                  "beside this file; `kbench grade FILE --seed S --case K` (in results.json "
                  "under failure.reproduce) repeats a failing case."]
    return "\n".join(lines) + "\n"


def _labels(sub: SubmissionResult) -> str:
    reused = [f"reused from run {sub.reused_from_run}"] if sub.reused_from_run else []
    return ", ".join([*sub.flags, *reused])


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split()).replace("|", "\\|")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def write(run: RunResult, out_dir: Path) -> tuple[Path, Path]:
    """Write leaderboard.md and results.json, each atomically (temp file, then rename)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    board = _atomic_write(out_dir / "leaderboard.md", leaderboard(run))
    data = _atomic_write(out_dir / "results.json", json.dumps(run.to_dict(), indent=2) + "\n")
    return board, data


def _atomic_write(path: Path, text: str) -> Path:
    """Readers see the old file or the new one, never half of either."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 is for secrets, not reports
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
