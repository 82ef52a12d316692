"""Same weights on both sides: ModelNew and Model are built from the same init inputs under the
same seed, so parameters and buffers created in the same order get the same values. Where a
candidate's output is wrong and weights it shares with Model by name and shape differ, the
verdict says so: the cause is the weights, not the kernel's arithmetic."""

from __future__ import annotations

import torch

from kbench.grading.context import Context
from kbench.shared.fingerprint import same_weights, weight_sums
from kbench.shared.protocol import WeightPrint

_NAMED = 3  # names quoted in a reason


def differing(ctx: Context, theirs: list[WeightPrint]) -> list[str]:
    """Names of the candidate's parameters and buffers whose values differ from the
    reference's of the same name, shape and dtype (built for the same case)."""
    mine = ctx.reference_state(ctx.load_spec())
    out = []
    for print_ in theirs:
        ref = mine.get(print_.name)
        if not isinstance(ref, torch.Tensor) or list(ref.shape) != print_.shape \
                or str(ref.dtype).removeprefix("torch.") != print_.dtype:
            continue
        if not same_weights(print_.sums, weight_sums(ref)):
            out.append(print_.name)
    return out


def explained(reason: str, names: list[str]) -> str:
    """A wrong output's reason, led by the weights that differ."""
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return (f"weights differ from the reference's: {', '.join(names[:_NAMED])}{more} (ModelNew "
            "must create its parameters in Model's order from the same init inputs: `kbench "
            f"new` writes such a skeleton); {reason}")
