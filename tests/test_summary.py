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


def _named(name: str, problem: str, speedup: float, ci: list[float]) -> SubmissionResult:
    return SubmissionResult(name=name, path="", sha256="", status=Status.OK, speedup=speedup,
                            speedup_ci=ci, problem=problem)


def test_a_speedup_whose_interval_spans_more_than_a_factor_of_two_is_inconclusive():
    from kbench.reports import html_report
    from kbench.reports.summary import inconclusive

    noisy = _named("gemm_torch", "a", 9.145, [0.979, 10.5])  # a busy host's figure
    clear = _named("a_clear", "a", 1.2, [1.15, 1.25])
    slow = _named("b_slow", "b", 0.5, [0.48, 0.52])
    alone = _named("c_noisy", "c", 3.0, [1.2, 6.0])  # its problem's only correct one
    run = _run([noisy, clear, slow, alone])
    assert inconclusive(noisy).startswith("timing inconclusive: the speedup's 95 % interval "
                                          "0.979-10.5 spans more than a factor of 2")
    assert inconclusive(clear) == inconclusive(slow) == ""
    assert inconclusive(_named("x", "a", 1.0, [0.7, 1.4])) == ""  # exactly a factor of 2
    s = summarise(run)
    assert s.inconclusive == ["gemm_torch", "c_noisy"]
    assert s.geomean == pytest.approx((1.2 * 0.5) ** 0.5)  # medians of clear figures only
    assert s.fast_plain[1.0] == pytest.approx(1 / 3)  # a only (its clear best, 1.2)
    assert s.fast_plain[0.0] == 1.0  # still correct
    assert s.fast[1.0] == pytest.approx(2 / 3)  # c's lower bound 1.2 is honest
    board = leaderboard(run)
    assert "- timings inconclusive for 2 correct submission(s)" in board
    assert "gemm_torch, c_noisy" in board
    ranked_a = board[board.index("## a"):board.index("## b")]
    assert ranked_a.index("a_clear") < ranked_a.index("gemm_torch")
    assert "not measurable here: 9.145x (0.979-10.5)" in ranked_a
    page = html_report.page(run)
    rows = page[page.index("<h2>Leaderboard"):]
    # every clear figure, even a slow one, ranks above an inconclusive one
    assert rows.index("b_slow") < rows.index("c_noisy") < rows.index("gemm_torch")
    assert "<b>Timings inconclusive</b> for 2 correct submission(s)" in page


def test_the_compile_row_says_not_timed_where_no_compile_figure_was_taken():
    run = _run([_named("a1", "a", 1.2, [1.15, 1.25]), _named("b1", "b", 2.0, [1.9, 2.1])])
    assert summarise(run).fast_compile == {}
    assert "| vs torch.compile, lower bound > p | not timed | not timed |" in leaderboard(run)


def test_the_reports_say_first_that_skipped_submissions_were_not_run():
    from kbench.reports import html_report

    why = "built with nvcc 13.0 for CUDA arch 9.0; needs a CUDA device to run"
    cuda = [SubmissionResult(name=f"b_cuda{i}", path="", sha256="", status=Status.SKIPPED,
                             reason=why, build_s=70.0 if i else 0.0, problem="b")
            for i in range(3)]
    run = _run([_named("a_torch", "a", 1.0, [0.98, 1.02]), *cuda])
    board = leaderboard(run)
    said = ("**Not run here**: 3 of 4 submissions were not run on this machine (2 of them "
            f"compiled, none timed or checked; most often: {why}); the correct rate")
    assert said in board and board.index(said) < board.index("- device:")
    assert "- correct: 1/1 problems" in board
    assert "<b>Not run here</b>: 3 of 4 submissions" in html_report.page(run)
    assert "Not run here" not in leaderboard(_run([_named("a1", "a", 1.0, [0.98, 1.02])]))


def test_fast_p_as_kernelbench_times_and_the_cost_of_timing_per_submission():
    subs = [_sub("a", Status.OK, 1.6, [1.55, 1.7]), _sub("b", Status.OK, 1.02, [0.97, 1.08]),
            _sub("d", Status.OK, 2.5, [2.2, 2.9])]
    for sub, kb, timing in zip(subs, (1.2, 1.7, 2.4), (10.0, 20.0, 30.0), strict=True):
        sub.kernelbench_speedup = kb
        sub.stage_s = {"load": 1.0, "timing": timing}
        sub.timing_s = {"rounds": timing / 2, "clock": timing / 4}
    s = summarise(_run(subs + [_sub("c", Status.WRONG_OUTPUT)]))
    # Means of KernelBench's trials, one figure per problem (its best by kbench's rank).
    assert s.fast_kernelbench == {0.0: 0.75, 1.0: 0.75, 1.5: 0.5, 2.0: 0.25}
    assert s.timing_s == pytest.approx(20.0)
    assert s.timing_parts == pytest.approx({"clock": 5.0, "rounds": 10.0})
    table = leaderboard(_run(subs))
    assert "| vs eager as KernelBench times (mean of its trials) > p | 100.0% |" in table
    assert "- timing: 20.0 s per timed submission on its GPU (clock 5.0 s, rounds 10.0 s)" \
        in table
    # A run where nothing has KernelBench's figure says so, not 0 %.
    assert summarise(_run([_sub("a", Status.OK, 1.6, [1.55, 1.7])])).fast_kernelbench == {}
