"""KernelBench's correctness rules, beside kbench's own, for a KernelBench problem file.

People compare their numbers with papers graded by KernelBench's evaluator, so each result of a
problem file also carries the verdict that evaluator's rules give: the problem's own sizes;
weights and ``get_init_inputs`` under seed 42; five trials whose seeds follow from seed 42,
each with ``get_inputs()`` drawn on the CPU under its seed and moved to the device; the
output's shape, then ``torch.allclose(reference, output, atol, rtol)`` against the reference
in the same dtype; KernelBench's tolerance for the dtype (1e-4 float32, 1e-2 16-bit since late
2025; 1e-2 everywhere in its v0) unless --atol/--rtol say otherwise; and the submission able
to use the problem file's module-level names, as in KernelBench's one shared namespace.
No cheat checks: those are kbench's rules' job. On a CPU run the "own sizes" are the ones
kbench's CPU plan shrinks them to (KernelBench itself runs only on GPUs).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from kbench.grading.channel import Channel, Stop
from kbench.grading.checking.compare import wide_chunks
from kbench.grading.context import Context
from kbench.problems.discovery import Submission
from kbench.problems.task import Params
from kbench.results.run_record import RuleVerdict, params_text
from kbench.results.verdict import Status, Verdict
from kbench.shared import inputs, protocol
from kbench.shared.outputs import as_tensor, own_copy

SEED = 42  # KernelBench's seed_num: weights, init inputs, and the trials' seeds
TRIALS = 5  # its num_correct_trials in scripts/eval_from_generations.py
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}  # atol = rtol, by dtype
V0_TOLERANCE = 1e-2  # KernelBench v0 and v0.1: atol = rtol = 1e-2 for every dtype
# Share of the host's available memory that kept trial inputs may take (see _drawn).
_KEPT_SHARE = 0.125
# Faults after which the worker cannot serve kbench's own cases: the same failure at the same
# sizes is kbench's verdict too.
ENDS_WORKER = (Status.CRASHED, Status.TIMEOUT, Status.CUDA_ERROR, Status.OUT_OF_MEMORY)
_NAME_ERROR = re.compile(r"NameError: name '(\w+)' is not defined")


@dataclass(frozen=True)
class Tolerance:
    """torch.allclose's: |reference - output| <= atol + rtol * |output| per element."""

    atol: float
    rtol: float

    def text(self) -> str:
        return f"atol=rtol={self.atol:g}" if self.atol == self.rtol else \
            f"atol={self.atol:g}, rtol={self.rtol:g}"


def applies(ctx: Context) -> bool:
    """KernelBench's rules are defined for problem files (get_inputs, get_init_inputs)."""
    return ctx.task.problem_inputs


def tolerance(ctx: Context, dtype: str | None = None) -> Tolerance:
    dtype = dtype or ctx.task.dtypes[0]
    default = TOLERANCE.get(dtype, TOLERANCE["float32"])
    atol = ctx.options.atol if ctx.options.atol is not None else default
    rtol = ctx.options.rtol if ctx.options.rtol is not None else (
        ctx.options.atol if ctx.options.atol is not None else default)
    return Tolerance(atol, rtol)


def own_params(ctx: Context) -> Params:
    """The problem's own sizes (on a CPU run, as kbench's CPU plan shrinks them)."""
    return ctx.task.correctness_on(ctx.device.type).fixed_shapes[0]


def trial_seeds() -> list[int]:
    """KernelBench's: torch.manual_seed(42), then one randint below 2**32 - 1 per trial."""
    generator = torch.Generator().manual_seed(SEED)
    return [int(torch.randint(0, 2**32 - 1, (1,), generator=generator).item())
            for _ in range(TRIALS)]


def missing_name(ctx: Context, reason: str) -> str | None:
    """The problem file's module-level name a NameError in ``reason`` says is undefined."""
    found = _NAME_ERROR.search(reason)
    return found[1] if found and hasattr(ctx.reference, found[1]) else None


def judge(ctx: Context, channel: Channel | None, sub: Submission,
          fresh: Callable[[], Channel], earlier: Verdict | None = None) -> RuleVerdict:
    """The verdict under KernelBench's rules. ``channel``: the submission's loaded worker
    (None where loading failed with ``earlier``). A NameError for one of the problem file's
    names is judged again in a ``fresh`` worker whose module starts with them."""
    verdict, passed = (earlier, 0) if channel is None else _trials(ctx, channel)
    if missing_name(ctx, verdict.reason):
        with fresh() as shared:
            try:
                shared.load(sub, instantiate=True, shared_names=True)
                verdict, passed = _trials(ctx, shared)
            except Stop as stop:
                verdict = stop.verdict
    return RuleVerdict(verdict.status, verdict.reason, passed)


def _trials(ctx: Context, channel: Channel) -> tuple[Verdict, int]:
    """Every trial, in order: the first failure is the verdict; and the trials passed."""
    params = own_params(ctx)
    dtype = ctx.task.dtypes[0]
    tol = tolerance(ctx, dtype)
    init = inputs.init_inputs(ctx.reference, params, SEED)
    spec = protocol.ModelSpec(init_args=init, dtype=dtype, seed=SEED, params=dict(params))
    for trial, seed in enumerate(trial_seeds(), start=1):
        stage = (f"KernelBench trial {trial} of {TRIALS} ({params_text(params)} {dtype}, "
                 f"seed {seed})")
        # copies: the reference or the worker may write its inputs, and the draw is kept
        args = [a.to(ctx.device, copy=True) if isinstance(a, torch.Tensor) else copy.deepcopy(a)
                for a in _drawn(ctx, params, dtype, seed)]
        expected, structure = ctx.reference_output(spec, args)
        # The worker gets copies (an output may alias an input it could write); what the
        # reference's run left reserved here goes back to the device first.
        request = protocol.Run([own_copy(a) for a in args], spec)
        del args
        ctx.release()
        try:
            answer = channel.call(request, ctx.task.limits.case_s, stage)
        except Stop as stop:
            return stop.verdict, trial - 1
        del request
        if isinstance(answer, protocol.Unsupported):
            return Verdict(Status.WRONG_OUTPUT, f"{stage}: returned {answer.output_type}"), \
                trial - 1
        wrong = allclose_failure(answer.returned, answer.structure, expected, structure, tol)
        if wrong:
            return Verdict(Status.WRONG_OUTPUT, f"{stage}: {wrong}"), trial - 1
        del answer, expected  # before the next trial's
    return Verdict(Status.OK), TRIALS


def _drawn(ctx: Context, params: Params, dtype: str, seed: int) -> list:
    """A trial's inputs, drawn on the CPU under its seed as KernelBench draws them: the same
    for every submission of the problem, so kept on ``ctx`` for the next one while all kept
    take at most _KEPT_SHARE of the host's available memory. A draw is one CPU thread's work
    (1.9 G normal values at level1/37_FrobeniusNorm_'s own sizes: 7.5 s on a 2-core VM's
    thread); that problem's five trials took 80 s of its submission on an H200, its checks
    2.5 s."""
    if seed in ctx.trial_inputs:
        return ctx.trial_inputs[seed]
    drawn = inputs.draw(ctx.reference, params, dtype, inputs.PROBLEM, seed, "cpu")
    held = sum(_nbytes(kept) for kept in ctx.trial_inputs.values())
    if held + _nbytes(drawn) <= _KEPT_SHARE * psutil.virtual_memory().available:
        ctx.trial_inputs[seed] = drawn
    return drawn


def _nbytes(values: list) -> int:
    return sum(v.nbytes for v in values if isinstance(v, torch.Tensor))


def allclose_failure(out: list, structure: str, expected: list, expected_structure: str,
                     tol: Tolerance) -> str | None:
    """Why ``out`` fails torch.allclose against ``expected`` (leaves and structures, as
    kbench.shared.outputs.flatten gives them) after a shape check, or None where it passes."""
    if structure != expected_structure:
        return f"returned {structure}, expected {expected_structure}"
    for i, (mine, want) in enumerate(zip(out, expected, strict=True)):
        where = f"output {i}: " if len(out) > 1 else ""
        mine, want = as_tensor(mine), as_tensor(want)
        if tuple(mine.shape) != tuple(want.shape):
            return f"{where}output shape {tuple(mine.shape)}, expected {tuple(want.shape)}"
        bad, worst = _beyond(mine, want, tol)
        if bad:
            return (f"{where}{bad} of {want.numel()} values beyond {tol.text()} "
                    f"(max abs err {worst})")
    return None


def _beyond(mine: torch.Tensor, want: torch.Tensor, tol: Tolerance) -> tuple[int, str]:
    """torch.allclose's test (NaN fails, an infinity matches only itself) a chunk at a time,
    in float64 (complex128 where either is complex, whose moduli it compares): the values
    beyond ``tol``, and where there are any, the largest finite error ("nan" where none is
    finite), found in a second pass: most outputs pass, and need only the first."""
    wide = torch.complex128 if mine.is_complex() or want.is_complex() else torch.float64
    bad = sum(_outside(got, ref, tol) for got, ref in wide_chunks(mine, want, wide))
    if not bad:
        return 0, ""
    worst: float | None = None
    for got, ref in wide_chunks(mine, want, wide):
        diff = (ref - got).abs()
        finite = torch.isfinite(diff)
        if bool(finite.any()):
            top = float(diff.where(finite, 0.0).max())
            worst = top if worst is None else max(worst, top)
    return bad, "nan" if worst is None else f"{worst:.3g}"


def _outside(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> int:
    diff = (ref - got).abs()
    within = diff <= got.abs().mul_(tol.rtol).add_(tol.atol)
    within &= torch.isfinite(diff)  # an infinity is close only to itself
    within |= got == ref
    return within.numel() - int(within.sum())


def loosest_passed(out: list, structure: str, expected: list, expected_structure: str,
                   dtype: str) -> str | None:
    """Which of KernelBench's tolerances an output kbench found wrong still passes: its
    current one for the dtype, else v0's 1e-2; None where neither does."""
    current = TOLERANCE.get(dtype, TOLERANCE["float32"])
    for value, name in ((current, "KernelBench's"), (V0_TOLERANCE, "KernelBench v0's")):
        tol = Tolerance(value, value)
        if allclose_failure(out, structure, expected, expected_structure, tol) is None:
            return f"within {name} {tol.text()}"
    return None
