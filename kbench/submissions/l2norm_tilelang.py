"""L2 normalisation in TileLang: one thread block per row; the sum of squares in float32 over
tiles of the row, reduced across the block, then the row scaled by its inverse norm (a zero row
stays zero). Rows and columns are symbolic, so one compiled kernel per dtype serves every size."""
import tilelang
import tilelang.language as T
import torch
import torch.nn as nn

_TILE = 1024  # columns per step; 256 threads handle 4 each
_THREADS = 256


def _kernel(dtype: str):
    rows, cols = T.dynamic("rows"), T.dynamic("cols")

    @T.prim_func
    def l2norm(x: T.Tensor((rows, cols), dtype), y: T.Tensor((rows, cols), dtype)):
        with T.Kernel(rows, threads=_THREADS) as row:
            squares = T.alloc_fragment((_TILE,), "float32")
            total = T.alloc_fragment((1,), "float32")
            T.clear(squares)
            for step in T.serial(T.ceildiv(cols, _TILE)):
                for j in T.Parallel(_TILE):
                    col = step * _TILE + j
                    v = T.if_then_else(col < cols, T.cast(x[row, col], "float32"), 0.0)
                    squares[j] += v * v
            T.reduce_sum(squares, total, dim=0)
            for step in T.serial(T.ceildiv(cols, _TILE)):
                for j in T.Parallel(_TILE):
                    col = step * _TILE + j
                    if col < cols:
                        scale = T.if_then_else(total[0] > 0, 1.0 / T.sqrt(total[0]), 0.0)
                        y[row, col] = T.cast(T.cast(x[row, col], "float32") * scale, dtype)

    return l2norm


_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_compiled: dict[torch.dtype, object] = {}


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    if x.dtype not in _compiled:
        _compiled[x.dtype] = tilelang.compile(_kernel(_NAMES[x.dtype]), out_idx=[1])
    return _compiled[x.dtype](x)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.numel() == 0:
            return torch.empty_like(x)
        return _l2norm(x)
