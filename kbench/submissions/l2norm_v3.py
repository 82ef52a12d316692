"""kbench's plain correct L2 normalisation: one block per row, warp-shuffle reduction.

Each block of 256 threads owns one row. Threads stride over the row summing squares in float
(float64 for float64 inputs), warps reduce with __shfl_xor_sync, the warp sums meet in shared
memory, and every thread then scales its elements by 1/norm; a row whose norm is zero gives
zeros. Row offsets are 64-bit, so 32768 x 65535 does not overflow. It reads x twice (once for
the norm, once to scale), which is what later versions improve on.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/AccumulateType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
l2norm_rows(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t dim) {
    using acc_t = at::acc_type<scalar_t, true>;
    const scalar_t* row_in = x + blockIdx.x * dim;
    scalar_t* row_out = y + blockIdx.x * dim;

    acc_t sum = 0;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const acc_t v = static_cast<acc_t>(row_in[i]);
        sum += v * v;
    }
    __shared__ acc_t partial[kWarps];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    sum = warp_sum(sum);
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        sum = warp_sum(lane < kWarps ? partial[lane] : acc_t(0));
        if (lane == 0) partial[0] = sum;
    }
    __syncthreads();

    const acc_t norm = sqrt(partial[0]);
    const acc_t inv = norm > acc_t(0) ? acc_t(1) / norm : acc_t(0);
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        row_out[i] = static_cast<scalar_t>(static_cast<acc_t>(row_in[i]) * inv);
    }
}

torch::Tensor l2norm_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "l2norm_v3: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "l2norm_v3: x must be 2-D (batch, dim), got ", x.dim(), "-D");
    auto input = x.contiguous();
    auto output = torch::empty_like(input);
    const int64_t batch = input.size(0), dim = input.size(1);
    if (input.numel() == 0) return output;
    TORCH_CHECK(batch <= 2147483647, "l2norm_v3: batch above 2^31 - 1 is not supported");
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                    input.scalar_type(), "l2norm_v3", [&] {
        l2norm_rows<scalar_t><<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
            input.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(), dim);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return output;
}
"""

cpp_source = "torch::Tensor l2norm_forward(torch::Tensor x);"

l2norm = load_inline(
    name="l2norm_v3",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["l2norm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2norm.l2norm_forward(x)
