"""The trusted side's check of one case (kbench.grading.correctness), with a stand-in context."""

import pytest
import torch

from kbench import protocol
from kbench.cases import Case
from kbench.grading import correctness
from kbench.grading.channel import Stop
from kbench.grading.context import Expected, NoExact
from kbench.task import Tolerance


class _Context:
    """A reference whose float64 copy runs out of memory once (as on a GPU whose memory the
    submission's process holds part of), then runs in float32 as kbench.grading.context's
    does after without_float64."""

    def __init__(self, truth: torch.Tensor) -> None:
        self.truth, self.exact_dtype, self.notes = truth, "float64", []

    def expected(self, params, dtype, args):
        if self.exact_dtype == "float64":
            raise NoExact(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12 GiB"))
        return Expected([self.truth], "tensor", [self.truth])

    def without_float64(self):
        self.exact_dtype = "float32"

    def tolerance(self, case):
        return Tolerance(rtol=1e-5, atol=1e-5)

    def failure(self, sub, case):
        return {}


CASE = Case(0, {"n": 4}, "float32", "problem", 1)


def _judge(ctx: _Context, out: torch.Tensor) -> None:
    x = torch.ones(4)
    answer = protocol.Ran([out], [out.clone()], "tensor", False)
    correctness._judge(ctx, None, CASE, [x], [x.clone()], answer, [out.clone()])


def test_a_float64_reference_that_does_not_fit_falls_back_to_float32_with_a_note():
    ctx = _Context(torch.arange(4.0))
    _judge(ctx, torch.arange(4.0))
    assert ctx.exact_dtype == "float32"
    assert "float64 copy could not run (OutOfMemoryError: CUDA out of memory" in ctx.notes[0]
    with pytest.raises(Stop, match="values wrong"):
        _judge(ctx, torch.zeros(4))
