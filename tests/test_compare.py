import math

import torch

from kbench.grading.checking import compare as judge
from kbench.grading.checking.compare import Comparison, compare_values, needed_scale
from kbench.problems.task import Tolerance
from kbench.reference import l2norm
from kbench.shared.outputs import Unsupported, flatten

FP32 = Tolerance(rtol=1e-5, atol=1e-5)


def reference(x):
    model = l2norm.Model()
    return model(x), model(x.double())


def compare(out, expected, exact, tol):
    """kbench.grading.checking.compare.compare on whole outputs, flattened as the worker does."""
    try:
        leaves, structure = flatten(out)
    except Unsupported as exc:
        return Comparison(False, f"returned {exc}")
    want, want_structure = flatten(expected)
    return judge.compare(leaves, structure, want, want_structure, flatten(exact)[0], tol)


def test_correct_float32_output_passes():
    (x,) = l2norm.make_inputs((16, 16384), "float32", "normal", seed=1)
    expected, exact = reference(x)
    assert compare(expected.clone(), expected, exact, FP32).ok


def test_float16_arithmetic_fails_on_small_outputs():
    # Outputs near 0.004 (dim 65535): an absolute 1e-4 would accept float16 math; kbench must not.
    (x,) = l2norm.make_inputs((4, 65535), "float32", "normal", seed=2)
    expected, exact = reference(x)
    half = l2norm.Model()(x.half()).float()
    assert (half - expected).abs().max() < 1e-4
    result = compare(half, expected, exact, FP32)
    assert not result.ok and "values wrong" in result.reason


def test_guessed_norm_fails():
    (x,) = l2norm.make_inputs((8, 4096), "float32", "normal", seed=3)
    expected, exact = reference(x)
    guessed = x / (4096 ** 0.5)  # the expected norm of N(0, 1) rows, not the actual one
    assert not compare(guessed, expected, exact, FP32).ok


def test_nan_only_where_reference_has_nan():
    ref = torch.tensor([1.0, float("nan"), float("inf"), 0.0], dtype=torch.float64)
    assert compare_values(ref.clone(), ref, FP32).ok
    got = ref.clone()
    got[3] = float("nan")
    result = compare_values(got, ref, FP32)
    assert not result.ok and "NaN where the reference is finite: 1" in result.reason
    got = ref.clone()
    got[1] = 0.0
    assert not compare_values(got, ref, FP32).ok
    got = ref.clone()
    got[2] = -float("inf")
    assert not compare_values(got, ref, FP32).ok


def test_type_shape_dtype_device_checked():
    x = torch.randn(3, 5)
    expected, exact = reference(x)
    assert "expected exactly torch.Tensor" in compare((expected,), expected, exact, FP32).reason
    sub = torch.nn.Parameter(expected.clone())
    assert not compare(sub, expected, exact, FP32).ok
    assert "shape" in compare(expected[:, :4], expected, exact, FP32).reason
    assert "dtype" in compare(expected.double(), expected, exact, FP32).reason


def test_tuples_integers_and_numbers_compare_leaf_by_leaf():
    x = torch.randn(4, 6)
    values, index = x.max(dim=1)
    exact = (x.double().max(dim=1).values, x.double().max(dim=1).indices)
    assert compare((values.clone(), index.clone()), (values, index), exact, FP32).ok
    assert "returned tensor, expected tuple(tensor, tensor)" in compare(
        values, (values, index), exact, FP32).reason
    wrong = index.clone()
    wrong[0] += 1
    result = compare((values, wrong), (values, index), exact, FP32)
    assert not result.ok and "output 1" in result.reason and "exactly" in result.reason
    assert compare(2.5, 2.5, 2.5, FP32).ok and not compare(2.6, 2.5, 2.5, FP32).ok
    assert "returned int, expected float" in compare(2, 2.5, 2.5, FP32).reason


def test_needed_scale_says_how_far_an_output_is():
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert needed_scale([ref.clone()], [ref], [ref], FP32) == 0
    off = ref * (1 + 4e-5)
    assert 1 < needed_scale([off], [ref], [ref], FP32) < 10
    assert needed_scale([torch.zeros(3, dtype=torch.float64)], [ref], [ref], FP32) > 1000
    assert needed_scale([torch.ones(2)], [ref], [ref], FP32) == math.inf


def test_large_outputs_are_judged_a_chunk_at_a_time_with_the_same_result(monkeypatch):
    # float64 copies of a whole large output do not fit beside it on a GPU: chunks must not
    # change what passes, what fails, or how far an output is from passing.
    (x,) = l2norm.make_inputs((8, 1000), "float32", "normal", seed=3)
    out, exact = reference(x)
    off = out.clone()
    off[5, 7] += 1e-3
    off[2, 2] = float("nan")
    cases = [(out, out), (off, out), (out * (1 + 3e-6), out)]
    whole = [(needed_scale([o], [e], [exact], FP32), compare(o, e, exact, FP32).ok)
             for o, e in cases]
    monkeypatch.setattr(judge, "_CHUNK", 777)  # not a divisor: a short last chunk
    chunked = [(needed_scale([o], [e], [exact], FP32), compare(o, e, exact, FP32).ok)
               for o, e in cases]
    assert chunked == whole
    assert [ok for _, ok in whole] == [True, False, True] and whole[1][0] == math.inf


def test_the_quick_pass_agrees_with_the_rule_on_every_kind_of_value():
    # compare_values passes most outputs in a few passes (isclose); it must pass exactly
    # those that the rule spelled out passes: finite within atol x rms + rtol x |ref|, NaN and
    # Inf only where the reference has the same.
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-9, 3.0, math.inf, -math.inf, math.nan])
    tol = Tolerance(rtol=1e-3, atol=1e-3)
    generator = torch.Generator().manual_seed(5)
    for _ in range(300):
        pick = torch.randint(0, len(special), (6,), generator=generator)
        ref = special[pick].double()
        got = ref.clone()
        where = torch.randint(0, 6, (1,), generator=generator)
        got[where] = special[torch.randint(0, len(special), (1,), generator=generator)].double()
        got += torch.randn(6, generator=generator, dtype=torch.float64) * \
            torch.tensor([0.0, 1e-6, 1e-2]).double()[torch.randint(0, 3, (1,),
                                                                   generator=generator)]
        finite = torch.isfinite(ref)
        scale = float(ref[finite].pow(2).mean().sqrt()) if bool(finite.any()) else 0.0
        rule = all(
            (math.isfinite(g) and abs(g - r) <= tol.atol * scale + tol.rtol * abs(r))
            if math.isfinite(r) else (math.isnan(g) if math.isnan(r) else g == r)
            for g, r in zip(got.tolist(), ref.tolist(), strict=True))
        assert compare_values(got, ref, tol).ok == rule, (got, ref)
