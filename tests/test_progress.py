"""What a run prints as it goes (kbench.cli.progress)."""

import io

from kbench.cli.progress import Progress
from kbench.results.run_record import SubmissionResult
from kbench.results.verdict import Status


def _result(name: str, status: Status) -> SubmissionResult:
    return SubmissionResult(name=name, path="", sha256="", status=status,
                            reason="" if status is Status.OK else "values wrong")


def test_plain_output_carries_counts_rate_and_time_left(monkeypatch):
    clock = iter([0.0, 1200.0, 1260.0, 1320.0, 1380.0])  # 20 min of builds, then 1 a minute
    monkeypatch.setattr("kbench.cli.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()  # not a terminal: plain lines, no bar
    progress = Progress(out)
    progress.say("l2norm: building 10 submission(s), 2 at a time")
    progress.result(_result("a", Status.OK), 1, 10)
    progress.result(_result("b", Status.WRONG_OUTPUT), 2, 10)
    progress.result(_result("c", Status.OK), 3, 10)
    progress.result(_result("d", Status.OK), 10, 10)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "l2norm: building 10 submission(s), 2 at a time"
    assert lines[3].startswith("[2/10] b: wrong_output - values wrong")
    assert lines[4] == "    so far: ok 1, wrong_output 1"  # no pace from one interval
    # The pace since the first result, not since the start: the builds say nothing of it.
    assert lines[6] == "    so far: ok 2, wrong_output 1; 1.0 per min, about 7 min left"
    assert "left" not in lines[8]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_the_counts_and_every_line_above_it():
    out = _Terminal()
    progress = Progress(out)
    progress.result(_result("a", Status.OK), 1, 2)
    progress.say("gemm: timing the reference again (drift check)")
    progress.result(_result("b", Status.WRONG_OUTPUT), 2, 2)
    progress.close()
    text = out.getvalue()
    assert "[1/2] a: ok" in text and "drift check" in text and "[2/2] b: wrong_output" in text
    assert "2/2" in text and "ok 1, wrong_output 1" in text  # the bar, at its end
