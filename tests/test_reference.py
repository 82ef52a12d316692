import pytest
import torch

from kbench.reference import l2norm


def test_zero_rows_give_zeros_and_others_unit_norm():
    x = torch.randn(4, 9, dtype=torch.float64)
    x[2] = 0
    y = l2norm.Model()(x)
    assert torch.equal(y[2], torch.zeros(9, dtype=torch.float64))
    norms = torch.linalg.vector_norm(y, dim=1)
    assert torch.allclose(norms[[0, 1, 3]], torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("distribution", l2norm.DISTRIBUTIONS)
@pytest.mark.parametrize("shape", [(1, 1), (5, 1), (3, 1023), (64, 4096)])
def test_make_inputs_keep_answer_unambiguous(dtype, distribution, shape):
    (x,) = l2norm.make_inputs(shape, dtype, distribution, seed=11)
    assert x.shape == shape and x.dtype == getattr(torch, dtype)
    assert torch.isfinite(x).all()
    norms = torch.linalg.vector_norm(x.double(), dim=1)
    nonzero = norms[norms > 0]
    assert nonzero.numel() == 0 or nonzero.min() >= 0.5 * l2norm._MIN_ROW_NORM[dtype]
    if distribution == "zero_rows":
        assert (norms == 0).any()
    else:
        assert (norms > 0).all()
    if dtype == "float16":
        assert x.abs().max() < 65504


def test_make_inputs_reproducible():
    a = l2norm.make_inputs((8, 100), "float32", "row_scaled", seed=5)[0]
    b = l2norm.make_inputs((8, 100), "float32", "row_scaled", seed=5)[0]
    c = l2norm.make_inputs((8, 100), "float32", "row_scaled", seed=6)[0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    scales = torch.linalg.vector_norm(a, dim=1)
    assert scales.max() / scales.min() > 10  # rows really are scaled differently
