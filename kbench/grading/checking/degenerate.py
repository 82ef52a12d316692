"""Two probes screening runs on the cases that represent the problem
(kbench.grading.checking.screen): does the reference's output change when its inputs are drawn again
with the same weights, and when its model is built under another seed on the same inputs? An output
the case's own check cannot tell from the first is one a kernel could return without reading the
inputs, or the weights. The problem is degenerate only where the probes agree on every such case: an
edge shape alone decides nothing (the L2 norm of a 1x1 input is its sign, which a redraw keeps half
the time), so the probes run on the problem's own sizes where it has them and on its largest
cases. Each probe costs one reference call in the case's dtype (and one model instance);
screening has checked that the cases fit in memory."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kbench.grading.checking.compare import identical, needed_scale
from kbench.grading.context import Context, Expected
from kbench.problems.cases import Case
from kbench.results.run_record import params_text
from kbench.shared import inputs
from kbench.shared.outputs import flatten

_OTHER = 0x0DD5EED  # xor-ed into the case's seed, and the models', for the other draw
PROBED = 3  # cases probed at most: the own sizes and the largest of distinct sizes


@dataclass(frozen=True)
class Probe:
    """What the two probes said on one case: True where the other output passes the check as
    the first's, None where the probe cannot tell (nothing to redraw, or it failed)."""

    case: Case
    same_inputs: bool | None
    same_weights: bool | None


def representative(ctx: Context, cases: list[Case], elements: dict[int, int]) -> list[Case]:
    """The cases the probes run on: a problem file's own sizes first (where planned), then the
    largest cases by ``elements`` (a case's index -> the elements of its inputs and output),
    one per distinct size, up to PROBED."""
    spec = ctx.task.correctness_on(ctx.device.type)
    own = dict(spec.fixed_shapes[0]) if ctx.task.problem_inputs and spec.fixed_shapes else None
    first = [c for c in cases if own is not None and c.params == own][:1]
    chosen, sizes = list(first), {tuple(sorted(c.params.items())) for c in first}
    for case in sorted(cases, key=lambda c: -elements.get(c.index, 0)):
        size = tuple(sorted(case.params.items()))
        if len(chosen) < PROBED and size not in sizes:
            chosen.append(case)
            sizes.add(size)
    return chosen


def independence(ctx: Context, cases: list[Case]) -> list[str]:
    """Reasons the reference's output is independent of its inputs or of its weights: each
    said only where the probe could tell on at least one of ``cases`` and every case it could
    tell on agrees (empty when the output depends on both)."""
    probes = [_probe(ctx, case) for case in cases]
    reasons = []
    inputs_told = [p for p in probes if p.same_inputs is not None]
    if inputs_told and all(p.same_inputs for p in inputs_told):
        reasons.append(f"independent of its inputs: on {_where(inputs_told)} the output for "
                       "inputs drawn again passes the check as the first's")
    weights_told = [p for p in probes if p.same_weights is not None]
    if weights_told and all(p.same_weights for p in weights_told):
        reasons.append(f"independent of its weights: on {_where(weights_told)} the output of "
                       "the model built under another seed passes the check as the first's")
    return reasons


def _where(probes: list[Probe]) -> str:
    return ", ".join(f"case {p.case.index} ({params_text(p.case.params)} {p.case.dtype})"
                     for p in probes)


def _probe(ctx: Context, case: Case) -> Probe:
    try:
        args = ctx.draw(case.params, case.dtype, case.distribution, case.seed)
        expected = ctx.expected(case.params, case.dtype, args)
    except Exception:  # a probe only: screening judged the case itself
        return Probe(case, None, None)
    return Probe(case, _same(ctx, case, expected, _other_inputs(ctx, case, args)),
                 _same(ctx, case, expected, _other_weights(ctx, case, args)))


def _same(ctx: Context, case: Case, expected: Expected, other: list | None) -> bool | None:
    if other is None:
        return None
    return needed_scale(other, expected.output, expected.exact, ctx.tolerance(case)) <= 1


def _other_inputs(ctx: Context, case: Case, args: list) -> list | None:
    """The output for other inputs of the same sizes (None where the draw cannot differ:
    no tensor inputs, or the same values again)."""
    try:
        other = ctx.draw(case.params, case.dtype, case.distribution, case.seed ^ _OTHER)
        if identical([a for a in args if type(a) is torch.Tensor],
                     [a for a in other if type(a) is torch.Tensor]):
            return None
        return ctx.expected(case.params, case.dtype, other, exact=False).output
    except Exception:  # a probe only
        return None


def _other_weights(ctx: Context, case: Case, args: list) -> list | None:
    """The output on the same inputs of a model built under another seed (None where the
    model has no parameters, or none differs under that seed)."""
    spec = ctx.spec(case.params, case.dtype)
    try:
        model = inputs.build(ctx.reference.Model, spec.init_args, spec.seed ^ _OTHER,
                             ctx.device, case.dtype, ctx.task.mode == "eval")
        mine = dict(ctx.model(spec).named_parameters())
        if all(identical(p.detach(), mine[name].detach())
               for name, p in model.named_parameters()):
            return None
        inputs.bind(ctx.reference, case.params)
        with torch.no_grad():
            return flatten(model(*args))[0]
    except Exception:  # a probe only
        return None
