"""L2 normalisation in Triton: one program per row; the sum of squares in float32 over blocks of
the row, then the row scaled by its inverse norm (a zero row stays zero)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _l2norm_rows(x_ptr, y_ptr, dim, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, dim, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride_x + offs, mask=offs < dim, other=0.0).to(tl.float32)
        acc += v * v
    norm = tl.sqrt(tl.sum(acc, axis=0))
    inv = tl.where(norm > 0, 1.0 / norm, 0.0)
    for start in range(0, dim, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < dim
        v = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y + offs, (v * inv).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        if x.numel() == 0:
            return y
        batch, dim = x.shape
        block = min(4096, triton.next_power_of_2(dim))
        _l2norm_rows[(batch,)](x, y, dim, x.stride(0), y.stride(0), BLOCK=block)
        return y
