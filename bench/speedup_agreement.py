"""Whether kbench's speedups rank samples as KernelBench's do: on the samples both tools call
correct, the Spearman rank correlation of the two speedups, and every sample where they differ
by more than a factor of DIFFER with its cause. bench/real_batch.py --kernelbench prints it.

KernelBench's speedup is its reference's mean time over the sample's (eval_results.json's
``runtime``; the reference's from the entry's ``ref_runtime`` where its evaluator wrote one,
else from a baseline file of its ``generate_baseline_time.py``: level -> problem file -> mean).
kbench's is the median-based speedup, and beside it kbench's own KernelBench-style figure
(``kernelbench_speedup``, kbench.grading.timing.kernelbench_timing), which names the cause: where it
agrees with KernelBench's, the methods differ; where it does not, KernelBench's own figure
moved between the runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

DIFFER = 1.5
LAUNCH_BOUND_MS = 0.05  # as kbench.results.run_record: mostly launch overhead below


@dataclass(frozen=True)
class KbenchFigure:
    speedup: float
    ci: tuple[float, float] | None
    kernelbench_style: float | None  # kbench's own timing of it as KernelBench times
    launch_bound: bool  # the reference ran under LAUNCH_BOUND_MS at some timed size
    disturbed: bool  # the host was disturbed while it was timed


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Pearson's correlation of the ranks; None under 3 pairs or where one side is constant."""
    if len(a) != len(b) or len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else None


def kbench_figures(results: dict, subs_root: Path) -> dict[str, KbenchFigure]:
    """kbench's ok submissions with a speedup, by their path below ``subs_root``."""
    figures = {}
    for sub in results.get("submissions", []):
        if sub.get("status") != "ok" or not sub.get("speedup"):
            continue
        try:
            key = Path(sub["path"]).resolve().relative_to(subs_root.resolve()).as_posix()
        except ValueError:
            continue
        benches = [b for b in sub.get("benchmarks", []) if b.get("candidate")]
        beside = sub.get("timed_beside") or {}
        figures[key] = KbenchFigure(
            sub["speedup"], tuple(sub["speedup_ci"]) if sub.get("speedup_ci") else None,
            sub.get("kernelbench_speedup"),
            any((b.get("reference") or {}).get("ms", 1.0) < LAUNCH_BOUND_MS for b in benches),
            bool(beside.get("disturbed")))
    return figures


def kernelbench_figures(eval_results: dict, samples: dict[str, str], level: int,
                        problem_files: dict[str, str], baseline: dict | None
                        ) -> tuple[dict[str, float], list[str]]:
    """KernelBench's speedups of its correct samples, by sample path (``samples``: its
    problem id -> the sample's path; ``problem_files``: problem id -> its file's name there),
    and why any correct one has none."""
    speedups, missing = {}, []
    for pid, entries in eval_results.items():
        path = samples.get(str(pid))
        for entry in entries if path else []:
            runtime = entry.get("runtime") or -1
            if not entry.get("correctness") or runtime <= 0:
                continue
            ref = entry.get("ref_runtime") or _baseline(baseline, level,
                                                        problem_files.get(str(pid), ""))
            if ref and ref > 0:
                speedups[path] = ref / runtime
            else:
                missing.append(path)
    return speedups, missing


def _baseline(baseline: dict | None, level: int, file: str) -> float | None:
    entry = ((baseline or {}).get(f"level{level}") or {}).get(file) or {}
    return entry.get("mean") if isinstance(entry, dict) else None


def report(mine: dict[str, KbenchFigure], theirs: dict[str, float]) -> list[str]:
    """The correlation line and one line per sample beyond DIFFER, with its cause."""
    both = sorted(set(mine) & set(theirs))
    rho = spearman([mine[p].speedup for p in both], [theirs[p] for p in both])
    lines = [f"speedups on {len(both)} sample(s) both call correct and both timed: Spearman "
             "rank correlation " + (f"{rho:.3f}" if rho is not None else "- (too few)")]
    for path in both:
        k, t = mine[path], theirs[path]
        if max(k.speedup / t, t / k.speedup) > DIFFER:
            lines.append(f"  {path}: kbench {k.speedup:.3g}x, KernelBench {t:.3g}x: "
                         + cause(k, t))
    return lines


def cause(k: KbenchFigure, theirs: float) -> str:
    said = []
    if k.ci and k.ci[0] > 0 and k.ci[1] > 2 * k.ci[0]:
        said.append(f"kbench's interval {k.ci[0]:.3g}-{k.ci[1]:.3g} is inconclusive")
    if k.disturbed:
        said.append("the host was disturbed while kbench timed it")
    if k.kernelbench_style is None:
        said.append("kbench has no KernelBench-style figure for it to tell the cause")
    elif max(k.kernelbench_style / theirs, theirs / k.kernelbench_style) <= DIFFER:
        said.append(f"method: timed as KernelBench times, kbench gets {k.kernelbench_style:.3g}x "
                    "too; kbench's own figure is a median of cold-L2 calls on fresh inputs, "
                    "device time behind a hold" + (", at launch-bound sizes where KernelBench's "
                                                   "mean includes the host's launch time"
                                                   if k.launch_bound else ""))
    else:
        said.append(f"run to run: timed as KernelBench times, kbench gets "
                    f"{k.kernelbench_style:.3g}x, so KernelBench's own figure moved between "
                    "the runs (a mean of 100 trials, no flush)")
    return "; ".join(said)
