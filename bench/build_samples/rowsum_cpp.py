"""A KernelBench-format sample for bench/build_cost.py on a CPU host: row sums in C++."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
torch::Tensor rowsum(torch::Tensor x) {
    auto in = x.contiguous();
    auto out = torch::zeros({in.size(0)}, in.options());
    const float* src = in.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t r = 0; r < in.size(0); ++r)
        for (int64_t c = 0; c < in.size(1); ++c) dst[r] += src[r * in.size(1) + c];
    return out;
}
"""

ext = load_inline(name="rowsum_cpp", cpp_sources=source, functions=["rowsum"],
                  extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.rowsum(x)
