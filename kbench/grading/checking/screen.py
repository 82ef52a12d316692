"""Screening a problem on the run's device before any submission: its reference must run, be
deterministic and pass its own check, and no case may be passed by what a lazy kernel
returns. A problem that fails is a ProblemError (reported once; its submissions get
task_error); what screening decides is said in the context's notes. A problem whose output
tells kernels apart poorly (rounding noise, constant, independent of its inputs or weights) is
still graded, and called degenerate with the reasons (kbench.grading.checking.degenerate, whose
probes run on the cases that represent the problem: its own sizes, its largest).

Per case, on the trusted side: the reference in the case's dtype on the case's input, the
same again (determinism), a float64 copy (the exact values), and three lazy outputs: zeros,
an input of the output's shape passed through, and a constant equal to the mean of the
output for another draw of the same sizes (a value a kernel could know without the input).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import psutil
import torch

from kbench.grading.checking import degenerate as probes
from kbench.grading.checking.compare import needed_scale
from kbench.grading.context import Context, Expected, NoExact
from kbench.problems.cases import Case
from kbench.problems.trial import TrialError, on_meta
from kbench.results.run_record import error_line, params_text
from kbench.shared.outputs import Unsupported, as_tensor

# A case a lazy output passes is tightened so that it fails by this factor, where the
# reference's own arithmetic still passes with this margin; otherwise the case is degenerate.
_LAZY_MARGIN = 2.0
_OWN_MARGIN = 4.0
# Where kbench's default tolerance is too tight for the reference's own arithmetic (float32
# against float64), it is widened to this many times what the reference needs, up to
# _MAX_WIDEN times (rtol 0.1): beyond that the check would tell little, and where every case
# needs more the output is rounding noise: the problem is degenerate, widened all the same.
_WIDEN = 2.0
_MAX_WIDEN = 1000.0
# The reference runs in kbench's own process (on a GPU, beside the processes it starts): a case
# whose tensors (the most alive at once, kbench.problems.trial, in the case's dtype and again
# in float64) would take more than this share of the free host or device memory is not run, so
# a problem too large for the machine cannot take kbench down with it. The rest leaves room for
# what the count cannot see (library workspaces, an op's own temporaries).
_MEMORY_SHARE = 0.6


class ProblemError(Exception):
    """The problem itself cannot be graded (the message names the file and the cause)."""


def screen(ctx: Context) -> None:
    """Check the reference on every planned case and adjust the plan (see module doc)."""
    seen: list[tuple[Case, float, Lazy]] = []  # case, own scale on the tolerance, lazy
    elements: dict[int, int] = {}  # case index -> elements of its inputs and output
    for case in ctx.cases:
        try:
            expected, args, again = _reference(ctx, case)
        except _Dropped as why:
            if not seen and case is ctx.cases[0]:
                sizes = f" ({params_text(case.params)})" if case.params else ""
                raise ProblemError(f"{ctx.task.path}: the reference fails at the problem's "
                                   f"own sizes{sizes}: {why}") from None
            ctx.notes.append(f"{case.describe()} dropped: the reference fails there ({why})")
            continue
        tol = ctx.tolerance(case)
        if needed_scale(again.output, expected.output, expected.output, tol) > 1:
            raise ProblemError(f"{ctx.task.path}: non-deterministic outputs: the reference "
                               f"gave two different outputs for one input on "
                               f"{case.describe()} (random ops such as dropout in training "
                               "mode? a task YAML can say mode: eval)")
        del again  # on a GPU every copy of a large output counts
        own = needed_scale(expected.output, expected.output, expected.exact, tol)
        seen.append((case, own, _lazy_scale(ctx, case, expected, args)))
        elements[case.index] = _elements(args) + _elements(expected.output)
        del args, expected
    seen = _without_noise(ctx, seen)
    widen = _own_check(ctx, max((own for _, own, _ in seen), default=0.0))
    degenerate: dict[str, list[int]] = {}
    ctx.cases = [_judged(ctx, case, own / widen, lazy.scale / widen,
                         degenerate.setdefault(lazy.what, []))
                 for case, own, lazy in seen]
    for what, indices in degenerate.items():
        if indices:
            ctx.notes.append(_degenerate_note(what, indices, len(ctx.cases)))
    constant = [lazy.constant_what for _, own, lazy in seen
                if lazy.constant <= min(widen, _LAZY_MARGIN * _OWN_MARGIN * own)]
    if ctx.cases and len(constant) == len(seen):
        ctx.degenerate.append(f"constant over inputs: {constant[0]} passes every case")
    elif ctx.cases:
        ctx.degenerate += probes.independence(
            ctx, probes.representative(ctx, ctx.cases, elements))
    ctx.release()  # the workers need the memory screening held


@dataclass(frozen=True)
class Lazy:
    """The lazy output that comes closest to passing a case: the factor on the case's
    tolerance under which it would pass, and what it is; the same for the closest constant
    (zeros, or another draw's mean), which no input decides."""

    scale: float
    what: str
    constant: float = math.inf
    constant_what: str = ""


def _without_noise(ctx: Context, seen: list[tuple[Case, float, Lazy]]
                   ) -> list[tuple[Case, float, Lazy]]:
    """Cases where the reference's own result is rounding noise (beyond what kbench would
    widen its default tolerance to: a group of one normalised, a mean of normalised values)
    are dropped, and said so, while other cases remain; if none remains, _own_check calls the
    problem degenerate."""
    noisy = [case.index for case, own, _ in seen if own * _WIDEN > _MAX_WIDEN]
    if not ctx.task.default_tolerance or not noisy or len(noisy) == len(seen):
        return seen
    ctx.notes.append(f"case{'s' if len(noisy) > 1 else ''} {', '.join(map(str, noisy))} "
                     "dropped: there the reference's own output differs from its float64 "
                     "self beyond any useful tolerance (its values are rounding noise)")
    return [entry for entry in seen if entry[0].index not in noisy]


def _degenerate_note(what: str, indices: list[int], total: int) -> str:
    which = "every case" if len(indices) == total else \
        f"case{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"
    return (f"{which} degenerate: {what}, which a lazy kernel could return, passes "
            f"{'them' if len(indices) > 1 else 'it'} (kept for the sizes; "
            + ("no case can tell such a kernel from a right one: the problem's inputs "
               "decide too little)" if len(indices) == total else "other cases decide)"))


class _Dropped(Exception):
    pass


def _reference(ctx: Context, case: Case) -> tuple[Expected, list, Expected]:
    """The reference's outputs on the case's input (exact and in dtype), the input, and the
    in-dtype output again; _Dropped if the reference raises."""
    _fits_in_memory(ctx, case)
    try:
        args = ctx.draw(case.params, case.dtype, case.distribution, case.seed)
        try:
            expected = ctx.expected(case.params, case.dtype, args)
        except NoExact as exc:
            ctx.without_float64()
            ctx.notes.append(f"the reference cannot run in float64 here "
                             f"({error_line(exc.cause)}): exact values come from float32, so "
                             "tolerances compare with float32")
            expected = ctx.expected(case.params, case.dtype, args)
        again = ctx.expected(case.params, case.dtype, args, exact=False)
    except Unsupported as exc:
        raise ProblemError(f"{ctx.task.path}: the reference returns {exc}; kbench compares dense "
                           "tensors and Python numbers, or tuples and lists of them") from None
    except Exception as exc:  # the reference's failure at these sizes, whatever it is
        raise _Dropped(error_line(exc)) from None
    return expected, args, again


def _fits_in_memory(ctx: Context, case: Case) -> None:
    """_Dropped where the case's reference runs would not fit in the free host or device
    memory (see _MEMORY_SHARE); checked on the meta device, for problem files."""
    if not ctx.task.problem_inputs:
        return
    try:
        work = on_meta(ctx.reference, case.params, case.dtype, ctx.task.mode == "eval")
    except TrialError:  # the reference's own failure shows when it runs
        return
    need = 3 * work.peak_bytes  # in the case's dtype, then in float64 (twice the bytes)
    if ctx.device.type == "cuda":
        ctx.release()  # what earlier cases held is free for this one
        free, where = torch.cuda.mem_get_info(ctx.device)[0], "device"
    else:
        free, where = psutil.virtual_memory().available, "host"
    if need > _MEMORY_SHARE * free:
        raise _Dropped(f"its reference would need about {need / 2**30:.1f} GiB of {where} "
                       f"memory (in {case.dtype} and float64), more than the "
                       f"{_MEMORY_SHARE:.0%} of the {free / 2**30:.1f} GiB free that kbench "
                       "lets a reference take")


def _judged(ctx: Context, case: Case, own: float, lazy: float, degenerate: list[int]
            ) -> Case:
    """A case a lazy output passes (``lazy`` <= 1 on the tolerance in force) is tightened
    until that output fails, where the reference's own arithmetic (``own``) keeps a margin;
    else its index goes to ``degenerate`` and it is kept: other cases decide."""
    if lazy > 1:
        return case
    if lazy <= _LAZY_MARGIN * _OWN_MARGIN * own:
        degenerate.append(case.index)
        return case
    case = replace(case, scale=case.scale * lazy / _LAZY_MARGIN)
    tol = ctx.tolerance(case)
    ctx.notes.append(f"{case.describe()}: tolerance tightened to rtol {tol.rtol:.3g}, atol "
                     f"{tol.atol:.3g} x rms: at the task's, an output a lazy kernel could "
                     "return (zeros, an input, a constant) passed it")
    return case


def _lazy_scale(ctx: Context, case: Case, expected: Expected, args: list) -> Lazy:
    """The lazy output closest to passing the case (see Lazy); each made and judged in
    turn, so that no more than one is held."""
    tol = ctx.tolerance(case)
    leaves = [as_tensor(leaf) for leaf in expected.output]
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    passed = [next((a for a in inputs if a.shape == leaf.shape and a.dtype == leaf.dtype),
                   None) for leaf in leaves]

    def zeros() -> list:
        return [torch.zeros_like(leaf) for leaf in leaves]

    def passed_through() -> list | None:
        if all(p is None for p in passed):
            return None
        return [p if p is not None else torch.zeros_like(leaf)
                for p, leaf in zip(passed, leaves, strict=True)]

    def constant() -> list | None:
        try:
            other_args = ctx.draw(case.params, case.dtype, case.distribution, case.seed ^ 0x5A5A)
            other = ctx.expected(case.params, case.dtype, other_args, exact=False).output
        except Exception:  # the other draw is a probe only; the case itself ran
            return None
        del other_args
        return [_constant(leaf, mine) for leaf, mine in zip(expected.output, other, strict=True)]

    best = Lazy(math.inf, "")
    for what, make in (("zeros", zeros), ("an input passed through", passed_through),
                       ("a constant (the mean of another draw's output)", constant)):
        out = make()
        if out is None:
            continue
        scale = needed_scale([_like(o, e) for o, e in zip(out, expected.output, strict=True)],
                             expected.output, expected.exact, tol)
        del out
        if make is not passed_through and (not best.constant_what or scale < best.constant):
            best = replace(best, constant=scale, constant_what=what)
        if not best.what or scale < best.scale:
            best = replace(best, scale=scale, what=what)
    return best


def _constant(leaf: object, other: object) -> torch.Tensor:
    want, seen = as_tensor(leaf), as_tensor(other)
    if not seen.numel():
        return torch.zeros_like(want)
    if seen.is_complex():
        return torch.full_like(want, complex(seen.to(torch.complex128).mean()))
    mean = seen.to(torch.float64).mean()
    value = mean if want.is_floating_point() else mean.round()
    return torch.full_like(want, float(value))


def _elements(values: list) -> int:
    return sum(v.numel() for v in values if isinstance(v, torch.Tensor))


def _like(lazy: torch.Tensor, leaf: object) -> object:
    """A lazy output leaf in the reference leaf's kind (a Python number stays a number)."""
    if type(leaf) is torch.Tensor:
        return lazy
    return type(leaf)(lazy.item())


def _own_check(ctx: Context, worst: float) -> float:
    """The reference in the case's dtype must pass against its float64 self: kbench's
    default tolerance is widened where it is too tight for that (the factor is returned); a
    task's own tolerance is not, and the problem cannot be graded."""
    if worst <= 1:
        return 1.0
    beyond = "beyond any tolerance (values where its float64 self is exactly 0, or not " \
        "finite)" if worst == float("inf") else f"{worst:.3g}x beyond"
    if not ctx.task.default_tolerance:
        raise ProblemError(f"{ctx.task.path}: the reference fails its own check: its output "
                           f"differs from its float64 self {beyond} the task's tolerance")
    factor = _WIDEN * worst
    if worst == math.inf:
        raise ProblemError(f"{ctx.task.path}: the reference's own output differs from its "
                           f"float64 self {beyond} kbench's default tolerance, too far to "
                           "widen it (random ops? an output of rounding noise? a task YAML "
                           "can set mode: eval or a tolerance)")
    if factor > _MAX_WIDEN:
        ctx.degenerate.append(f"rounding noise: on every case the reference's own output "
                              f"differs from its float64 self {beyond} kbench's default "
                              "tolerance; graded at the tolerance its own arithmetic needs")
    ctx.task = replace(ctx.task, tolerance={d: t.scaled(factor)
                                            for d, t in ctx.task.tolerance.items()})
    tol = ctx.task.tolerance[ctx.task.dtypes[0]]
    ctx.notes.append(f"tolerance widened to rtol {tol.rtol:.3g}, atol {tol.atol:.3g} x rms "
                     f"({ctx.task.dtypes[0]}): the reference's own result differs from its "
                     f"float64 self up to {worst:.3g}x kbench's default")
    return factor
