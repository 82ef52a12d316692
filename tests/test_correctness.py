"""The trusted side's check of one case (kbench.grading.checking.correctness), with a stand-in
context."""

from types import SimpleNamespace

import pytest
import torch

from kbench.grading.channel import Stop
from kbench.grading.checking import correctness
from kbench.grading.context import Expected, NoExact
from kbench.problems.cases import Case
from kbench.problems.task import Tolerance
from kbench.shared import protocol


class _Context:
    """A reference whose float64 copy runs out of memory once (as on a GPU whose memory the
    submission's process holds part of), then runs in float32 as kbench.grading.context's
    does after without_float64."""

    def __init__(self, truth: torch.Tensor) -> None:
        self.truth, self.exact_dtype, self.notes = truth, "float64", []
        self.task = SimpleNamespace(problem_inputs=False)  # a task of kbench's own format

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


def test_a_fingerprint_sees_any_write_and_nothing_else():
    from kbench.grading.checking.compare import fingerprint

    out = torch.randn(3, 1000)
    key = 12345
    before = fingerprint([out, 7], key)
    assert fingerprint([out.clone(), 7], key) == before  # the same bytes
    assert fingerprint([out], key + 1) != before[:1]  # another key, another print
    for write in (lambda t: t.__setitem__((2, 999), t[2, 999] + 1e-6),
                  lambda t: t.__setitem__((0, 0), -0.0 if t[0, 0] == 0 else -t[0, 0]),
                  lambda t: t.copy_(t.flip(0))):  # moved, not changed: still a write
        changed = out.clone()
        write(changed)
        assert fingerprint([changed, 7], key) != before
    assert fingerprint([out.to(torch.float64), 7], key) != before  # dtype counts


def test_outputs_past_the_memory_bound_are_rechecked_early_and_still_caught(
        monkeypatch, tmp_path, cache_dir):
    # With no room to hold outputs, each case's is looked at (SETTLE_S after its call) before
    # the next case: a write after the call returned is caught all the same.
    from conftest import FIXTURES, grade, quick_task

    monkeypatch.setattr(correctness, "_HELD_BYTES", 0)
    task = quick_task(tmp_path)
    subs = [str(FIXTURES / "cpu" / f"l2norm_{n}.py") for n in ("late_write", "torch_ok")]
    code, results = grade([*subs, "--task", str(task), "--device", "cpu", "--no-timing",
                           "--seed", "3"], tmp_path / "out", cache_dir)
    verdicts = {s["name"]: (s["status"], s["reason"]) for s in results["submissions"]}
    assert verdicts["l2norm_torch_ok"] == ("ok", "")
    assert verdicts["l2norm_late_write"][0] == "flagged"
    assert "the output changed after it was returned" in verdicts["l2norm_late_write"][1]
