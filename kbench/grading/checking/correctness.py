"""Correctness: every planned case, fresh inputs made here, the candidate's output back, the
reference computed here afterwards; then a recheck that no output changed after it was
returned."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace

import torch

from kbench.grading.channel import Channel, Stop
from kbench.grading.checking import kernelbench_rules
from kbench.grading.checking.compare import compare, fingerprint, identical, needed_scale
from kbench.grading.context import Context, NoExact
from kbench.problems.cases import Case
from kbench.problems.discovery import Submission
from kbench.results.run_record import SubmissionResult, error_line
from kbench.results.verdict import Status, Verdict
from kbench.shared import protocol
from kbench.shared.outputs import own_copy

_random = random.SystemRandom()  # choices a submission must not be able to predict

# Outputs are compared with their checked copies this long, at least, after the last case's
# call returned (see recheck): a case's output written later than this after its call goes
# unseen there (a timed call's, written while kbench looks, is caught by integrity.verify).
SETTLE_S = 0.5


# Outputs of earlier cases are rechecked early, and let go, once those held pass this many
# bytes: the worker keeps every output the grader holds, which for a problem of many GiB per
# output would not fit beside the next case.
_HELD_BYTES = 2 << 30

_TWIN_MIN = 64  # values (the product of a case's sizes) a picked case has, where any has
_TWIN_SLACK = 10.0  # on the tolerance of the repeated case's twin (see _with_repeat)


@dataclass(frozen=True)
class Returned:
    """An output's leaves as the worker returned them (memory the worker can still write),
    the fingerprint of the copy that was checked (compare.fingerprint, under ``key``),
    and when (time.monotonic()) the answer came."""

    shared: list
    prints: list
    key: int
    case: Case
    at: float

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.shared
                   if type(t) is torch.Tensor)


def check(ctx: Context, channel: Channel, sub: Submission,
          result: SubmissionResult | None) -> list[Returned]:
    """Every case: fresh inputs here, the candidate's output back, the reference after.
    Passed cases are counted in ``result``. The first failure raises Stop: wrong_output for
    wrong values; flagged for right values from a call that returned a view of its input or
    changed its input. Values are judged on the copy the worker made as the call returned
    (see kbench.worker.serve), never on the output itself, which a thread may still be
    writing. One case, picked at random, is sent twice: the second output must match the
    first (determinism). Returns the outputs still held, each with its checked copy's
    fingerprint, for recheck; earlier ones were rechecked already to bound the memory held."""
    returned: list[Returned] = []
    first_again = None
    for case, role in _with_repeat(ctx):
        inputs = ctx.draw(case.params, case.dtype, case.distribution, case.seed)
        sent = [own_copy(t) for t in inputs]  # shared with the worker: its writes show here
        request = protocol.Run(sent, ctx.spec(case.params, case.dtype))
        try:
            answer = channel.call(request, ctx.task.limits.case_s, case.describe())
        except Stop as stop:
            stop.failure = ctx.failure(sub, case)
            raise
        if isinstance(answer, protocol.Unsupported):
            raise Stop(Verdict(Status.WRONG_OUTPUT, f"{case.describe()}: returned "
                               f"{answer.output_type}, expected dense tensors or Python numbers, "
                               "or tuples and lists of them"),
                       ctx.failure(sub, case))
        out = [own_copy(v) for v in answer.returned]  # the grader's own: no worker can write it
        _judge(ctx, sub, case, inputs, sent, answer, out)
        if role == "again":
            _same_twice(ctx, sub, case, first_again, out)
        elif role == "first":
            first_again = out
        key = _random.getrandbits(62)
        returned.append(Returned(answer.outputs, fingerprint(out, key), key, case,
                                 time.monotonic()))
        if result is not None and role in ("once", "first"):
            result.cases_passed += 1
        del inputs, sent, request, answer, out  # before the next case's: one case at a time
        ctx.release()
        while len(returned) > 1 and sum(r.nbytes for r in returned) > _HELD_BYTES:
            recheck(ctx, sub, returned[:1])
            del returned[0]
    return returned


def _with_repeat(ctx: Context) -> list[tuple[Case, str]]:
    """Every case once ("once", or "first" for the one picked at random to be sent again),
    and the picked one "again", to the same model instance, right after the last case that
    instance serves: it has seen every other input it serves in between, and the worker,
    which keeps only its latest few instances, still holds it. Then its "twin": the same
    sizes and dtype, other values (a seed derived from its own, so that ``--case`` repeats
    it), which an output cached by shape does not survive: random cases rarely share sizes.
    The twin's draw was not screened, so its tolerance is _TWIN_SLACK times the case's: a
    stale output misses by the output's whole scale, honest rounding by far less."""
    if not ctx.cases:
        return []
    # A case of a few values could give its twin the same output (an L2 norm of one value
    # is its sign): the pick is among cases of many values where there are any.
    pick = _random.choice([c for c in ctx.cases if math.prod(c.params.values()) >= _TWIN_MIN]
                          or ctx.cases)
    key = repr(ctx.spec(pick.params, pick.dtype))
    last = max(i for i, case in enumerate(ctx.cases)
               if repr(ctx.spec(case.params, case.dtype)) == key)
    order = [(case, "first" if case is pick else "once") for case in ctx.cases]
    twin = replace(pick, seed=(pick.seed * 6364136223846793005 + 1442695040888963407) % 2**63,
                   scale=pick.scale * _TWIN_SLACK)
    order[last + 1:last + 1] = [(pick, "again"), (twin, "twin")]
    return order


def _judge(ctx: Context, sub: Submission, case: Case, inputs: list, sent: list,
           answer: protocol.Ran, out: list) -> None:
    """Right values (against the reference in float64), and the inputs left alone."""
    try:
        expected = ctx.expected(case.params, case.dtype, inputs)
    except NoExact as exc:  # on a GPU, the float64 copy may not fit beside the worker
        ctx.without_float64()
        ctx.notes.append(f"{case.describe()}: the reference's float64 copy could not run "
                         f"({error_line(exc.cause)}): from there on, exact values come from "
                         "float32")
        expected = ctx.expected(case.params, case.dtype, inputs)
    outcome = compare(out, answer.structure, expected.output, expected.structure,
                      expected.exact, ctx.tolerance(case))
    if not outcome.ok:
        failure = ctx.failure(sub, case)
        failure.update(max_abs_err=outcome.max_abs_err, max_rel_err=outcome.max_rel_err)
        if kernelbench_rules.applies(ctx):  # named as a cause (kbench.grading.checking.causes)
            failure["within_kernelbench"] = kernelbench_rules.loosest_passed(
                out, answer.structure, expected.output, expected.structure, case.dtype)
        raise Stop(Verdict(Status.WRONG_OUTPUT, f"{case.describe()}: {outcome.reason}"),
                   failure)
    caught = None
    if answer.aliases_input:
        caught = "returned a view of its input"
    elif not all(identical(s, p) for s, p in zip(sent, inputs, strict=True)):
        caught = "changed its input"
    if caught:
        raise Stop(Verdict(Status.FLAGGED, f"{case.describe()}: {caught} (the output values "
                           "were right)"), ctx.failure(sub, case))


def _same_twice(ctx: Context, sub: Submission, case: Case, first: list, second: list) -> None:
    """The same input, sent twice: the outputs, each right, must also agree with each other
    within the case's tolerance."""
    scale = needed_scale(second, first, first, ctx.tolerance(case))
    if scale <= 1:
        return
    raise Stop(Verdict(Status.FLAGGED, f"{case.describe()}: the same input twice gave "
                       f"different outputs (they differ {scale:.3g}x beyond the tolerance)"),
               ctx.failure(sub, case))


def recheck(ctx: Context, sub: Submission, returned: list[Returned]) -> None:
    """Every case's output must still hold what it held when its call returned: a thread or
    stream that writes it afterwards makes the check meaningless. Looked at once per case, at
    least SETTLE_S after its call returned, in case order (after all the cases and before
    timing, unless memory made ``check`` look at early ones sooner): the verdict and the case
    it names do not depend on how fast this process happened to be (timed calls' outputs have
    checks of their own, see integrity.verify)."""
    if not returned:
        return
    time.sleep(max(0.0, returned[-1].at + SETTLE_S - time.monotonic()))
    for item in returned:
        if fingerprint(item.shared, item.key) != item.prints:
            raise Stop(Verdict(Status.FLAGGED, f"{item.case.describe()}: the output changed "
                               "after it was returned"), ctx.failure(sub, item.case))
