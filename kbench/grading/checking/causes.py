"""A failure's cause named in its reason, in words a user can act on: what kbench's rules
caught that KernelBench's would not have (a tolerance, sizes beyond the problem's own), a name
only the problem file defines, a torch C++ API the installed torch no longer has. A crashed
worker's last output is added where the crash is seen (kbench.grading.channel)."""

from __future__ import annotations

import re

import torch

from kbench.grading.checking import kernelbench_rules
from kbench.grading.context import Context
from kbench.results.run_record import SubmissionResult, params_text
from kbench.results.verdict import Status, Verdict

# A compiler error about torch's C++ API itself: a member, conversion, header or symbol of
# at::, c10:: or torch:: (or THC, removed in torch 1.11) that is not there.
_TORCH_API = re.compile(r"\b(?:at|c10|torch)::|DeprecatedTypeProperties|\bTHC|\bTensor\b")
_MISSING = re.compile(r"has no member|no suitable (?:user-defined )?conversion|cannot convert|"
                      r"is not a member of|No such file or directory|no instance of|"
                      r"was not declared|no matching function|is deprecated|has been removed",
                      re.IGNORECASE)


def named(ctx: Context, result: SubmissionResult, verdict: Verdict) -> Verdict:
    """``verdict`` with the first cause that applies appended to its reason (kbench's
    verdict; ``result.kernelbench``, where set, is the verdict under KernelBench's rules)."""
    if verdict.status is Status.OK:
        return verdict
    cause = (_problem_name(ctx, verdict) or _torch_api(verdict)
             or _beside_kernelbench(ctx, result, verdict))
    return Verdict(verdict.status, f"{verdict.reason} [{cause}]") if cause else verdict


def _problem_name(ctx: Context, verdict: Verdict) -> str | None:
    if not kernelbench_rules.applies(ctx):
        return None
    name = kernelbench_rules.missing_name(ctx, verdict.reason)
    return (f"`{name}` is defined by the problem file, not by the submission: kbench runs "
            "them apart (KernelBench runs both in one namespace)") if name else None


def _torch_api(verdict: Verdict) -> str | None:
    reason = verdict.reason
    if verdict.status is Status.BUILD_ERROR and _TORCH_API.search(reason) \
            and _MISSING.search(reason):
        return (f"an API of torch's C++ that the installed torch {torch.__version__} does "
                "not have: the submission was written against another torch")
    return None


def _beside_kernelbench(ctx: Context, result: SubmissionResult, verdict: Verdict) -> str | None:
    """What kbench's rules caught that KernelBench's passed."""
    failure = result.failure or {}
    within = failure.get("within_kernelbench")
    if verdict.status is Status.WRONG_OUTPUT and within:
        return f"beyond kbench's tolerance, {within}"
    kb = result.kernelbench
    case = failure.get("case")
    if kb is None or kb.status is not Status.OK or case is None or \
            verdict.status is Status.FLAGGED:
        return None
    own = dict(kernelbench_rules.own_params(ctx))
    if case["params"] != own:
        return (f"correct at the problem's own sizes ({params_text(own)}) under KernelBench's "
                f"rules; the first size that fails is {params_text(case['params'])}")
    return ("correct on the problem's own inputs under KernelBench's rules; other values "
            "at the same sizes fail")
