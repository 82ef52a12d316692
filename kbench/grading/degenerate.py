"""Two probes screening runs on one case (kbench.grading.screen): does the reference's output
change when its inputs are drawn again with the same weights, and when its model is built under
another seed on the same inputs? An output the case's own check cannot tell from the first is
one a kernel could return without reading the inputs, or the weights: the problem is
degenerate. Each probe costs one reference call in the case's dtype (and one model instance);
screening has checked that the case fits in memory."""

from __future__ import annotations

import torch

from kbench.grading.compare import identical, needed_scale
from kbench.grading.context import Context, Expected
from kbench.problems.cases import Case
from kbench.results.run_record import params_text
from kbench.shared import inputs
from kbench.shared.outputs import flatten

_OTHER = 0x0DD5EED  # xor-ed into the case's seed, and the models', for the other draw


def independence(ctx: Context, case: Case) -> list[str]:
    """Reasons the reference's output is independent of its inputs or of its weights on
    ``case`` (empty when it depends on both, or a probe cannot tell)."""
    where = f"case {case.index} ({params_text(case.params)} {case.dtype})"
    try:
        args = ctx.draw(case.params, case.dtype, case.distribution, case.seed)
        expected = ctx.expected(case.params, case.dtype, args)
    except Exception:  # a probe only: screening judged the case itself
        return []
    reasons = []
    if _same(ctx, case, expected, _other_inputs(ctx, case, args)):
        reasons.append(f"independent of its inputs: on {where} the output for inputs drawn "
                       "again passes the check as the first's")
    if _same(ctx, case, expected, _other_weights(ctx, case, args)):
        reasons.append(f"independent of its weights: on {where} the output of the model "
                       "built under another seed passes the check as the first's")
    return reasons


def _same(ctx: Context, case: Case, expected: Expected, other: list | None) -> bool:
    return other is not None and needed_scale(other, expected.output, expected.exact,
                                              ctx.tolerance(case)) <= 1


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
