"""Seed 000: the user's own documented L2 normalisation solution, kept exactly as written.

It is a test subject for kbench: do not fix it. The description that came with it:

**Description of Optimizations:**
- **L2 Normalization:** Replaced the PyTorch `torch.norm` function with a custom CUDA kernel. This allows for more efficient computation since it avoids the overhead of calling a Python function and instead performs the computation directly on the GPU using parallel threads.
- **Kernel Implementation:** The CUDA kernel iterates over each element in the batch and computes the L2 norm. It then divides each element by the computed norm. This approach ensures that the normalization is done efficiently in parallel, leveraging the GPU's computational power.

This optimization should lead to significant speedup compared to the original implementation, especially for large batch sizes and dimensions.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

# Define the custom CUDA kernel for L2 normalization
l2_norm_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void l2_norm_kernel(float* data, int batch_size, int dim) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < batch_size) {
        float norm = 0.0f;
        for (int i = 0; i < dim; ++i) {
            norm += data[idx * dim + i] * data[idx * dim + i];
        }
        norm = sqrt(norm);
        for (int i = 0; i < dim; ++i) {
            data[idx * dim + i] /= norm;
        }
    }
}

torch::Tensor l2_norm_cuda(torch::Tensor data, int batch_size, int dim) {
    auto out = data.clone();

    const int block_size = 256;
    const int num_blocks = (batch_size + block_size - 1) / block_size;

    l2_norm_kernel<<<num_blocks, block_size>>>(out.data_ptr<float>(), batch_size, dim);

    return out;
}
"""

l2_norm_cpp_source = (
    "torch::Tensor l2_norm_cuda(torch::Tensor data, int batch_size, int dim);"
)

# Compile the inline CUDA code for L2 normalization
l2_norm = load_inline(
    name="l2_norm",
    cpp_sources=l2_norm_cpp_source,
    cuda_sources=l2_norm_source,
    functions=["l2_norm_cuda"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.l2_norm = l2_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_size, dim = x.size(0), x.size(1)
        return self.l2_norm.l2_norm_cuda(x, batch_size, dim)
