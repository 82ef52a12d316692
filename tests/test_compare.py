import torch

from kbench.compare import compare, compare_values
from kbench.reference import l2norm
from kbench.task import Tolerance

FP32 = Tolerance(rtol=1e-5, atol=1e-5)


def reference(x):
    model = l2norm.Model()
    return model(x), model(x.double())


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
