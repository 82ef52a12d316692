"""What a run prints as it goes (kbench.cli.progress)."""

import io

from kbench.cli.progress import Progress
from kbench.results.run_record import SubmissionResult
from kbench.results.verdict import Status


def _result(name: str, status: Status) -> SubmissionResult:
    return SubmissionResult(name=name, path="", sha256="", status=status,
                            reason="" if status is Status.OK else "values wrong")


def test_plain_output_carries_counts_rate_and_time_left():
    out = io.StringIO()  # not a terminal: plain lines, no bar
    progress = Progress(out)
    progress.say("l2norm: building 3 submission(s), 2 at a time")
    progress.result(_result("a", Status.OK), 1, 3)
    progress.result(_result("b", Status.WRONG_OUTPUT), 2, 3)
    progress.result(_result("c", Status.OK), 3, 3)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "l2norm: building 3 submission(s), 2 at a time"
    assert lines[3].startswith("[2/3] b: wrong_output - values wrong")
    assert "so far: ok 1, wrong_output 1; " in lines[4] and "min left" in lines[4]
    assert "so far: ok 2, wrong_output 1; " in lines[6] and "left" not in lines[6]


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
