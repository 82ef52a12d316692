"""A KernelBench-format sample for bench/build_cost.py on a CPU host: x * s as a C++ extension."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
torch::Tensor scale(torch::Tensor x, double s) {
    return x.contiguous().mul(s);
}
"""

ext = load_inline(name="scale_cpp", cpp_sources=source, functions=["scale"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, s: float = 2.0) -> None:
        super().__init__()
        self.s = s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.scale(x, self.s)
