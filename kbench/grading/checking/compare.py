"""Compare a candidate's output with the reference: structure, then per tensor type, shape,
dtype, device, then values."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kbench.problems.task import Tolerance
from kbench.shared.outputs import as_tensor

# Elements compared at a time in large outputs (each float64 temporary is 128 MiB).
_CHUNK = 1 << 24


@dataclass(frozen=True)
class Comparison:
    ok: bool
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None


def compare(out: list, structure: str, expected: list, expected_structure: str, exact: list,
            tol: Tolerance) -> Comparison:
    """An output (leaves and structure, kbench.shared.outputs) against the reference's: the same
    structure; per tensor leaf the same type, shape, dtype and device as ``expected`` (the
    reference run in the case's dtype); then floating values within ``tol`` of ``exact`` (the
    reference in float64), integer and bool values equal to ``expected``'s."""
    reason = _structure(structure, expected_structure)
    if reason:
        return Comparison(False, reason)
    worst = Comparison(True, "", 0.0, 0.0)
    for i, (mine, want, best) in enumerate(zip(out, expected, exact, strict=True)):
        mine, want, best = as_tensor(mine), as_tensor(want), as_tensor(best)
        outcome = Comparison(False, reason) if (reason := _mismatch(mine, want)) else \
            _values(_real(mine), _real(want), _real(best), tol)
        if not outcome.ok:
            where = f"output {i}: " if len(out) > 1 else ""
            return Comparison(False, where + outcome.reason, outcome.max_abs_err,
                              outcome.max_rel_err)
        worst = Comparison(True, "", max(worst.max_abs_err, outcome.max_abs_err or 0.0),
                           max(worst.max_rel_err, outcome.max_rel_err or 0.0))
    return worst


def _values(mine: torch.Tensor, want: torch.Tensor, best: torch.Tensor,
            tol: Tolerance) -> Comparison:
    if not want.is_floating_point():
        if torch.equal(mine, want):
            return Comparison(True, "", 0.0, 0.0)
        bad = (mine != want)
        first = [int(i) for i in bad.nonzero()[0]] if mine.dim() else []
        got = mine[tuple(first)].item() if mine.dim() else mine.item()
        expected = want[tuple(first)].item() if want.dim() else want.item()
        return Comparison(False, f"{int(bad.sum())} of {bad.numel()} values wrong (first at "
                          f"{first}: got {got}, expected {expected}; integer and bool outputs "
                          "must match exactly)")
    if best.numel() > _CHUNK:  # float64 copies of the whole would be several times its size
        return _chunked(mine, best, tol, _CHUNK)
    return compare_values(mine.detach().to(torch.float64), best.to(torch.float64), tol)


def compare_in_chunks(out: list, structure: str, expected: list, expected_structure: str,
                      tol: Tolerance, chunk: int = _CHUNK) -> Comparison:
    """``compare`` against ``expected`` alone (the reference in the output's dtype), a chunk
    of elements at a time: for outputs too large to hold in float64 twice over, such as a
    timed call's. The rms scale is each whole reference leaf's."""
    reason = _structure(structure, expected_structure)
    if reason:
        return Comparison(False, reason)
    for i, (mine, want) in enumerate(zip(out, expected, strict=True)):
        mine, want = as_tensor(mine), as_tensor(want)
        if reason := _mismatch(mine, want):
            return Comparison(False, (f"output {i}: " if len(out) > 1 else "") + reason)
        mine, want = _real(mine), _real(want)
        # in float32 for outputs of 32 bits or fewer: its rounding is far inside twice any
        # tolerance, and a timed call's outputs are compared many times (half the time on a CPU)
        wide = torch.float64 if want.dtype == torch.float64 else torch.float32
        outcome = _chunked(mine, want, tol, chunk, wide) if want.is_floating_point() else \
            _values(mine, want, want, tol)
        if not outcome.ok:
            where = f"output {i}: " if len(out) > 1 else ""
            return Comparison(False, where + outcome.reason, outcome.max_abs_err,
                              outcome.max_rel_err)
    return Comparison(True)


def wide_chunks(mine: torch.Tensor, want: torch.Tensor, wide: torch.dtype = torch.float64,
                chunk: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Two tensors of one shape, ``chunk`` of their flat elements at a time (default
    _CHUNK), each chunk in ``wide``: scratch memory bounded whatever the output's size.
    float64 copies of a whole 8 GiB output, and their temporaries, did not fit an H200 beside
    the worker (KernelBench's level1/38_L1Norm_ at its own sizes)."""
    size = chunk or _CHUNK
    got, ref = mine.detach().reshape(-1), want.reshape(-1)
    for a, b in zip(got.split(size), ref.split(size), strict=True):
        yield a.to(wide), b.to(wide)


def _chunked(mine: torch.Tensor, want: torch.Tensor, tol: Tolerance, chunk: int,
             wide: torch.dtype = torch.float64) -> Comparison:
    """Every chunk judged on the device, one synchronisation for the whole (per chunk, a
    timed call's verification at 32768x65535 took 128 of them); where any chunk fails, the
    chunks again one by one for the first that does and its details."""
    scale = _finite_rms(want.reshape(-1), chunk)
    passed = torch.ones((), dtype=torch.bool, device=want.device)
    for a, b in wide_chunks(mine, want, wide, chunk):
        passed &= torch.isclose(a, b, rtol=tol.rtol, atol=tol.atol * scale,
                                equal_nan=True).all()
    if bool(passed):
        return Comparison(True)
    for start, (a, b) in enumerate(wide_chunks(mine, want, torch.float64, chunk)):
        outcome = compare_values(a, b, tol, scale)
        if not outcome.ok:
            return Comparison(False, f"from flat element {start * chunk}: {outcome.reason}",
                              outcome.max_abs_err, outcome.max_rel_err)
    return Comparison(True)


def _finite_rms(ref: torch.Tensor, chunk: int) -> float:
    """The rms of a flat tensor's finite values, a chunk at a time, summed on the device
    (no masked copies, one synchronisation)."""
    squares = torch.zeros((), dtype=torch.float64, device=ref.device)
    count = torch.zeros((), dtype=torch.int64, device=ref.device)
    for part in ref.split(chunk):
        finite = torch.isfinite(part)
        squares += torch.where(finite, part, 0).to(torch.float64).square().sum()
        count += finite.sum()
    n = int(count)
    return math.sqrt(float(squares) / n) if n else 0.0


def _real(values: torch.Tensor) -> torch.Tensor:
    """Complex values as (real, imaginary) pairs, compared as floats: a plain conversion to
    float64 would keep only the real part."""
    return torch.view_as_real(values.resolve_conj()) if values.is_complex() else values


def _structure(got: str, want: str) -> str | None:
    if got == want:
        return None
    if want == "tensor" and got != "tensor":
        return f"returned {got}, expected exactly torch.Tensor"
    return f"returned {got}, expected {want}"


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
    if scale is None:
        scale = _rms(ref[ref_finite])
    # The same rule in a few passes (isclose: |got - ref| <= atol + rtol * |ref|, equal NaNs
    # and equal infinities close): most outputs pass, and the details below take a score of
    # passes over the float64 copies (this function held 4.7 s of kbench's own process while
    # it graded one l2norm submission under the full profile on an H100).
    if bool(torch.isclose(got, ref, rtol=tol.rtol, atol=tol.atol * scale, equal_nan=True).all()):
        return Comparison(True)
    both_finite = ref_finite & torch.isfinite(got)
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


def identical(a: object, b: object) -> bool:
    """Same shape, dtype and values, NaN equal to NaN: has a tensor (or a list of leaves)
    changed since it was copied?"""
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(identical(x, y) for x, y in zip(a, b, strict=True)))
    if type(a) is not torch.Tensor or type(b) is not torch.Tensor:
        return type(a) is type(b) and (a == b or (a != a and b != b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


_PRINT_CHUNK = 1 << 24  # bytes folded at a time: bounded scratch memory for any output size


def fingerprint(leaves: list, key: int) -> list:
    """Per leaf, its shape, dtype and bytes folded with weights drawn from the secret ``key``:
    equal for unchanged memory and, with overwhelming odds, different after any write made
    without the key. A few numbers per leaf where a copy would double the output's memory
    (kbench.grading.checking.correctness keeps one per case until the recheck)."""
    prints = []
    for i, leaf in enumerate(leaves):
        if type(leaf) is not torch.Tensor:
            prints.append(leaf)
            continue
        raw = leaf.detach().contiguous().reshape(-1).view(torch.uint8)
        generator = torch.Generator(device=raw.device)
        total = torch.zeros((), dtype=torch.int64, device=raw.device)
        for n, start in enumerate(range(0, raw.numel(), _PRINT_CHUNK)):
            chunk = raw[start:start + _PRINT_CHUNK].to(torch.int64)
            generator.manual_seed((key * 1_000_003 + i * 65_537 + n) % (1 << 63))
            weights = torch.randint(-(1 << 62), 1 << 62, chunk.shape, generator=generator,
                                    device=raw.device, dtype=torch.int64)
            total += (chunk * weights).sum()  # int64 arithmetic wraps: a hash mod 2**64
        prints.append((tuple(leaf.shape), str(leaf.dtype), int(total)))
    return prints


def needed_scale(out: list, expected: list, exact: list, tol: Tolerance) -> float:
    """The smallest factor on ``tol`` under which ``out`` would pass (leaves of the same
    structure as the reference's): 0 for an exact match, inf where no tolerance would do
    (a wrong shape or dtype, NaN where the reference is finite, unequal integers)."""
    worst = 0.0
    for mine, want, best in zip(out, expected, exact, strict=True):
        mine, want, best = as_tensor(mine), as_tensor(want), as_tensor(best)
        if _mismatch(mine, want):
            return math.inf
        mine, want, best = _real(mine), _real(want), _real(best)
        if not want.is_floating_point():
            if not torch.equal(mine, want):
                return math.inf
            continue
        rms = _finite_rms(best.reshape(-1), _CHUNK)
        for a, b in wide_chunks(mine, best):
            worst = max(worst, _scale_needed(a, b, tol, rms))
            if worst == math.inf:
                return worst
    return worst


def _scale_needed(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance, rms: float) -> float:
    """Without masked copies (a screening's lazy outputs ask this of every case three times:
    on two CPU cores, copies of the finite values were most of a problem's screening)."""
    finite = torch.isfinite(ref)
    if bool((finite & ~torch.isfinite(got)).any()) or not bool(
            ((got == ref) | (torch.isnan(got) & torch.isnan(ref)) | finite).all()):
        return math.inf
    err = torch.where(finite, got - ref, 0.0).abs_()
    worst = float(err.max()) if err.numel() else 0.0
    if worst == 0:
        return 0.0
    allowed = ref.abs().mul_(tol.rtol).add_(tol.atol * rms)
    if bool((allowed > 0).all()):
        return float(err.div_(allowed).max())
    ratio = torch.where(allowed > 0, err / allowed.clamp_min(1e-300),
                        torch.where(err > 0, math.inf, 0.0))
    return float(ratio.max())
