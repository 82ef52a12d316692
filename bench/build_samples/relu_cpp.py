"""A KernelBench-format sample for bench/build_cost.py on a CPU host: ReLU as a C++ extension."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
torch::Tensor relu(torch::Tensor x) {
    auto out = torch::empty_like(x);
    auto in = x.contiguous();
    const float* src = in.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < in.numel(); ++i) dst[i] = src[i] > 0.f ? src[i] : 0.f;
    return out;
}
"""

relu = load_inline(name="relu_cpp", cpp_sources=source, functions=["relu"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu.relu(x)
