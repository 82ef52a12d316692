"""Compare a candidate's output with the reference: type, shape, dtype, device, then values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kbench.task import Tolerance


@dataclass(frozen=True)
class Comparison:
    ok: bool
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None


def compare(out: object, expected: torch.Tensor, exact: torch.Tensor, tol: Tolerance) -> Comparison:
    """``expected`` is the reference run at the input's own dtype (for type, shape, dtype and
    device); ``exact`` is the reference run in float64 on the same input (for values)."""
    reason = _mismatch(out, expected)
    if reason:
        return Comparison(False, reason)
    return compare_values(out.detach().to(torch.float64), exact, tol)


def compare_in_chunks(out: object, expected: torch.Tensor, tol: Tolerance,
                      chunk: int = 1 << 24) -> Comparison:
    """``compare`` against ``expected`` alone (the reference in the output's dtype), a chunk
    of elements at a time: for outputs too large to hold in float64 twice over, such as a
    timed call's. The rms scale is the whole reference's."""
    reason = _mismatch(out, expected)
    if reason:
        return Comparison(False, reason)
    got, ref = out.detach().reshape(-1), expected.reshape(-1)
    squares, count = 0.0, 0
    for part in ref.split(chunk):
        finite = part[torch.isfinite(part)].to(torch.float64)
        squares, count = squares + float(finite.pow(2).sum()), count + finite.numel()
    scale = math.sqrt(squares / count) if count else 0.0
    for start, (mine, theirs) in enumerate(zip(got.split(chunk), ref.split(chunk),
                                               strict=True)):
        outcome = compare_values(mine.to(torch.float64), theirs.to(torch.float64), tol, scale)
        if not outcome.ok:
            return Comparison(False, f"from flat element {start * chunk}: {outcome.reason}",
                              outcome.max_abs_err, outcome.max_rel_err)
    return Comparison(True)


def _mismatch(out: object, expected: torch.Tensor) -> str | None:
    """Why ``out`` is not even the right kind of tensor, or None."""
    if type(out) is not torch.Tensor:
        return (f"returned {type(out).__module__}.{type(out).__qualname__}, "
                "expected exactly torch.Tensor")
    for what, got, want in (("shape", tuple(out.shape), tuple(expected.shape)),
                            ("dtype", out.dtype, expected.dtype),
                            ("device", out.device, expected.device)):
        if got != want:
            return f"output {what} {got}, expected {want}"
    return None


def compare_values(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance,
                   scale: float | None = None) -> Comparison:
    """NaN and Inf pass only where the reference has the same; finite values within tolerance
    (atol times ``scale``, by default the rms of the reference's finite values)."""
    ref_finite = torch.isfinite(ref)
    both_finite = ref_finite & torch.isfinite(got)
    if scale is None:
        scale = _rms(ref[ref_finite])
    err = torch.where(both_finite, (got - ref).abs(), torch.zeros_like(ref))
    within = err <= tol.atol * scale + tol.rtol * ref.abs()
    same_special = (torch.isnan(ref) & torch.isnan(got)) | (torch.isinf(ref) & (got == ref))
    bad = torch.where(ref_finite, both_finite & within, same_special).logical_not()

    max_abs = float(err.max()) if err.numel() else 0.0
    nonzero = both_finite & (ref != 0)
    max_rel = float((err[nonzero] / ref[nonzero].abs()).max()) if bool(nonzero.any()) else 0.0
    n_bad = int(bad.sum())
    if n_bad == 0:
        return Comparison(True, "", max_abs, max_rel)

    first = tuple(int(i) for i in bad.nonzero()[0])
    details = [f"{n_bad} of {bad.numel()} values wrong "
               f"(first at {list(first)}: got {float(got[first]):.6g}, "
               f"expected {float(ref[first]):.6g})"]
    nan_where_finite = int((ref_finite & torch.isnan(got)).sum())
    inf_where_finite = int((ref_finite & torch.isinf(got)).sum())
    if nan_where_finite:
        details.append(f"NaN where the reference is finite: {nan_where_finite}")
    if inf_where_finite:
        details.append(f"Inf where the reference is finite: {inf_where_finite}")
    details.append(f"max abs err {max_abs:.3g}, max rel err {max_rel:.3g} "
                   f"(rtol {tol.rtol:g}, atol {tol.atol:g} x rms {scale:.3g})")
    return Comparison(False, "; ".join(details), max_abs, max_rel)


def _rms(values: torch.Tensor) -> float:
    return float(values.pow(2).mean().sqrt()) if values.numel() else 0.0


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and values, NaN equal to NaN: has a tensor changed since it was
    copied?"""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return bool(((a == b) | (a.isnan() & b.isnan())).all())
