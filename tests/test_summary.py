"""A batch run's numbers: a problem counts once, fast_p on the lower bound of the interval,
KernelBench's plain fast_p on the median beside it, problem errors apart."""

import pytest

from kbench.reports.markdown import leaderboard
from kbench.reports.summary import summarise
from kbench.results.run_record import ProblemRun, RunResult, SubmissionResult
from kbench.results.verdict import Status


def _sub(problem: str, status: Status, speedup=None, ci=None) -> SubmissionResult:
    return SubmissionResult(name=f"{problem}/s", path="", sha256="", status=status,
                            speedup=speedup, speedup_ci=ci, compile_speedup=speedup,
                            compile_speedup_ci=ci, problem=problem)


def _run(submissions: list[SubmissionResult]) -> RunResult:
    return RunResult(
        kbench_version="t", task="set", seed=1, started="", environment={},
        problems=[ProblemRun("a", "", ""), ProblemRun("b", "", ""), ProblemRun("c", "", ""),
                  ProblemRun("d", "", ""), ProblemRun("e", "", "", error="broken")],
        submissions=submissions)


def test_fast_p_counts_problems_on_the_lower_bound():
    run = _run([
        _sub("a", Status.OK, 1.6, [1.55, 1.7]),   # clearly faster than 1.5
        _sub("a", Status.WRONG_OUTPUT),
        _sub("b", Status.OK, 1.02, [0.97, 1.08]),  # the same speed: faster only by luck
        _sub("c", Status.WRONG_OUTPUT),
        _sub("d", Status.OK, 2.5, [2.2, 2.9]),
        _sub("e", Status.TASK_ERROR),
    ])
    s = summarise(run)
    assert (s.problems, s.problem_errors, s.correct, s.submissions) == (4, 1, 3, 6)
    assert s.counts == {"ok": 3, "wrong_output": 2, "task_error": 1}
    assert s.fast == {0.0: 0.75, 1.0: 0.5, 1.5: 0.5, 2.0: 0.25}
    assert s.fast_plain[1.0] == 0.75  # b's median is above 1
    assert s.geomean == pytest.approx((1.6 * 1.02 * 2.5) ** (1 / 3))
    table = leaderboard(run)
    assert "| vs eager, lower bound of the 95% interval > p | 75.0% | 50.0% | 50.0% | 25.0% |" \
        in table


def test_an_untimed_run_shows_no_fast_p():
    table = leaderboard(_run([_sub("a", Status.OK), _sub("b", Status.WRONG_OUTPUT)]))
    assert "fast_p: no correct submission was timed" in table and "| p=1 |" not in table
