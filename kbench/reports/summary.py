"""A run over many problems in a few numbers: verdict counts, correct rate, fast_p and the
geometric-mean speedup, per problem set.

A problem counts once whatever its number of samples: it is correct, or fast, where any of
its submissions is; its speedup is its best submission's (highest lower bound). ``fast_p`` is the
share of gradable problems with a correct submission more than p times faster than the
reference, judged on the lower bound of the speedup's 95 % interval: a submission that is
the reference itself does not count as faster by luck. KernelBench's plain fast_p (on the
median alone) stands beside it, and the same against torch.compile. Problems that could not
be graded at all (task_error), problems whose every submission was skipped (this machine could
not run them: no verdict on the kernel) and degenerate problems (run_record.ProblemRun: a
lazy kernel may pass them, unless the run includes them) are left out of the shares and
counted apart.

A speedup whose 95 % interval spans more than a factor of INCONCLUSIVE (the host was busy
while it was timed, or its sizes are too small to time here) is inconclusive: its median
means little, so it ranks after every clear figure (by its lower bound), a problem's best
is a clear figure where it has one, and it is left out of the median-based fast_p (above
p = 0) and the geometric mean; the lower-bound fast_p keeps it, its bound being honest.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from kbench.results.run_record import RunResult, SubmissionResult, params_text
from kbench.results.verdict import Status
from kbench.shared.stats import geomean

THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
# A speedup whose interval's upper bound is more than this many times its lower cannot be
# placed between fast_p's thresholds (1, 1.5, 2): the figure is inconclusive.
INCONCLUSIVE = 2.0


@dataclass
class Summary:
    problems: int  # gradable problems (with at least one submission)
    problem_errors: int
    submissions: int
    counts: dict[str, int]  # verdict -> submissions
    correct: int  # problems with a correct submission
    fast: dict[float, float] = field(default_factory=dict)  # p -> share, on the lower bound
    fast_plain: dict[float, float] = field(default_factory=dict)  # KernelBench's: the median
    # Lower bound, vs compile; empty where no correct submission has a torch.compile figure.
    fast_compile: dict[float, float] = field(default_factory=dict)
    geomean: float | None = None  # of each problem's best speedup (problems with one)
    degenerate: int = 0  # degenerate problems left out (see the module's doc)
    skipped: int = 0  # problems whose every submission was skipped
    inconclusive: list[str] = field(default_factory=list)  # correct, timing inconclusive
    # fast_p with each speedup as KernelBench's evaluator computes it (the mean of its
    # trials, kbench.grading.timing.kernelbench_timing); empty where no correct one has it.
    fast_kernelbench: dict[float, float] = field(default_factory=dict)
    # Seconds of timing per timed submission (the slot holds its GPU meanwhile): in all,
    # and by part (results' timing_s); None where nothing was timed.
    timing_s: float | None = None
    timing_parts: dict[str, float] = field(default_factory=dict)

    @property
    def correct_rate(self) -> float:
        return self.correct / self.problems if self.problems else 0.0

    def apart(self) -> str:
        """What else was left out of the shares besides problem errors, as the reports say
        it ("" when nothing was)."""
        return "".join([f"; {self.skipped} more with every submission skipped"
                        if self.skipped else "",
                        f"; {self.degenerate} more degenerate: graded, but left out of these "
                        "figures (--include-degenerate counts them)" if self.degenerate else ""])


def not_run(run: RunResult) -> str:
    """What the reports say first where submissions were not run on this machine (skipped:
    built where a toolkit was found, then no device to run them), "" where all ran: a
    correct rate counts only what ran."""
    skipped = [s for s in run.submissions if s.status is Status.SKIPPED]
    if not skipped:
        return ""
    built = sum(1 for s in skipped if s.build_s)
    reason = Counter(s.reason for s in skipped).most_common(1)[0][0]
    return (f"{len(skipped)} of {len(run.submissions)} submissions were not run on this "
            f"machine ({built} of them compiled, none timed or checked; most often: "
            f"{reason}); the correct rate and fast_p count only the submissions that ran, "
            "and a problem whose every submission was skipped is left out of them")


def degenerate_counts(run: RunResult) -> str:
    """How the run's degenerate problems count, as the reports say it."""
    if run.include_degenerate:
        return "graded, and counted in fast_p and the geometric mean (--include-degenerate)"
    return "graded; left out of fast_p and the geometric mean unless --include-degenerate"


def inconclusive(sub: SubmissionResult) -> str:
    """Why the submission's speedup is not measurable here ("" when its figure is clear, or
    it has none)."""
    ci = sub.speedup_ci
    if not sub.speedup or not ci or ci[0] <= 0 or ci[1] <= INCONCLUSIVE * ci[0]:
        return ""
    wide = [b for b in sub.benchmarks if b.speedup and b.speedup_ci and b.speedup_ci[0] > 0]
    widest = max(wide, key=lambda b: b.speedup_ci[1] / b.speedup_ci[0], default=None)
    at = (f", widest at {params_text(widest.params)} ({widest.speedup_ci[0]:.3g}-"
          f"{widest.speedup_ci[1]:.3g})") if widest is not None and len(wide) > 1 else ""
    return (f"timing inconclusive: the speedup's 95 % interval {ci[0]:.3g}-{ci[1]:.3g} spans "
            f"more than a factor of {INCONCLUSIVE:g}{at}: the host was busy while it was "
            "timed, or the sizes are too small to time here")


def rank_key(sub: SubmissionResult) -> tuple:
    """Sorts correct submissions best first: clear figures by their median, then
    inconclusive ones by their lower bound, then those without a speedup."""
    if inconclusive(sub):
        return (1, -_low(sub.speedup, sub.speedup_ci))
    return (0 if sub.speedup else 2, -(sub.speedup or 0.0))


def best(subs: list[SubmissionResult]) -> SubmissionResult | None:
    """The problem's best correct submission: a clear figure before an inconclusive one, then
    the highest lower bound of its speedup (a correct one without a speedup ranks last)."""
    ok = [s for s in subs if s.status is Status.OK]
    return max(ok, key=lambda s: (s.speedup is not None and not inconclusive(s),
                                  _low(s.speedup, s.speedup_ci), s.speedup or 0.0),
               default=None)


def _low(value: float | None, ci: list[float] | None) -> float:
    if value is None:
        return -math.inf
    return ci[0] if ci else value


def _by_problem(run: RunResult) -> tuple[dict[str, list[SubmissionResult]], set[str]]:
    """Submissions by problem; and the problems that could not be graded."""
    by_problem: dict[str, list[SubmissionResult]] = {}
    for sub in run.submissions:
        by_problem.setdefault(sub.problem, []).append(sub)
    return by_problem, {p.name for p in run.problems if p.error}


def _apart(run: RunResult, by_problem: dict[str, list[SubmissionResult]], broken: set[str]
           ) -> tuple[set[str], set[str]]:
    """Problems counted apart besides the broken: those whose every submission was skipped,
    and (unless the run includes them) the degenerate."""
    skipped = {name for name, subs in by_problem.items() if name not in broken
               and all(s.status is Status.SKIPPED for s in subs)}
    degenerate = set() if run.include_degenerate else \
        {p.name for p in run.problems if p.degenerate} & set(by_problem) - broken - skipped
    return skipped, degenerate


def best_per_problem(run: RunResult) -> dict[str, SubmissionResult | None]:
    """Each gradable problem's best correct submission (None where none is correct)."""
    by_problem, broken = _by_problem(run)
    left_out = broken.union(*_apart(run, by_problem, broken))
    return {name: best(subs) for name, subs in by_problem.items() if name not in left_out}


def summarise(run: RunResult) -> Summary:
    by_problem, broken = _by_problem(run)
    skipped, degenerate = _apart(run, by_problem, broken)
    gradable = {name: subs for name, subs in by_problem.items()
                if name not in broken | skipped | degenerate}
    ok = [[s for s in subs if s.status is Status.OK] for subs in gradable.values()]
    n = len(gradable)

    def share(passes) -> dict[float, float]:
        return {p: sum(1 for subs in ok if any(passes(s, p) for s in subs)) / n if n else 0.0
                for p in THRESHOLDS}

    winners = [best(subs) for subs in ok if subs]
    timed = [w.speedup for w in winners if w.speedup and not inconclusive(w)]
    compiled = any(s.compile_speedup for subs in ok for s in subs)
    return Summary(
        problems=n, problem_errors=len(broken & set(by_problem)),
        submissions=len(run.submissions),
        counts=dict(Counter(s.status.value for s in run.submissions)),
        correct=sum(1 for subs in ok if subs),
        fast=share(lambda w, p: p == 0 or _low(w.speedup, w.speedup_ci) > p),
        fast_plain=share(lambda w, p: p == 0 or (not inconclusive(w)
                                                 and (w.speedup or 0.0) > p)),
        fast_compile=share(lambda w, p: p == 0 or _low(w.compile_speedup,
                                                      w.compile_speedup_ci) > p)
        if compiled else {},
        geomean=geomean(timed) if timed else None,
        degenerate=len(degenerate), skipped=len(skipped),
        inconclusive=[s.name for s in run.submissions
                      if s.status is Status.OK and inconclusive(s)],
        fast_kernelbench=share(lambda w, p: p == 0 or (w.kernelbench_speedup or 0.0) > p)
        if any(s.kernelbench_speedup for subs in ok for s in subs) else {},
        **_timing_cost(run))


def _timing_cost(run: RunResult) -> dict:
    """Mean seconds of timing per timed submission, in all and by part."""
    timed = [s for s in run.submissions if "timing" in s.stage_s and s.reused_from_run is None]
    if not timed:
        return {}
    parts = sorted({k for s in timed for k in s.timing_s})
    return {"timing_s": sum(s.stage_s["timing"] for s in timed) / len(timed),
            "timing_parts": {k: sum(s.timing_s.get(k, 0.0) for s in timed) / len(timed)
                             for k in parts}}
