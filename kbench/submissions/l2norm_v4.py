"""L2 normalisation, step 4: one pass over DRAM, the row held in registers between the two phases.

Changed from v3: v3 reads x twice, once to sum the squares and once more to scale, so it moves
1.5x the minimum traffic (read x twice, write y once). v4 keeps each thread's elements of the
row in registers after the first read: THREADS threads x K elements per thread, K unrolled at
compile time so the values stay in registers (128 x 8, 256 x 16 or 512 x 32, picked from the
row length, up to 16384 elements). The sum of squares is reduced per warp with shuffles and
across warps in shared memory, and the same registers are then scaled and stored: x is read
from DRAM once for every row of up to 16384 elements.

Still the same launch as v3, one CTA per row, and still 4-byte (float32) or 2-byte (float16,
bfloat16) loads and stores. Rows longer than 16384 elements (32768 x 65535 has 65535) do not
fit: the part beyond the registers is read in the first phase and again in the second, as in
v3; v6 splits such rows over several CTAs instead.

Inputs whose rows are contiguous (stride 1 along dim 1, any row stride) are read in place;
others are copied once with .contiguous(). float32 accumulation for float16 and bfloat16
(float64 for float64), 64-bit row offsets, zero rows give zeros.

What it bought (kbench, H100 80GB HBM3, run seed 496937219; full table in docs/l2norm-kernels.md):
8192x8192 0.269 -> 0.182 ms (66 -> 98 % of the copy bandwidth), 65536x1024 0.240 -> 0.182 ms
(75 -> 98 %), 4096x4096 80 -> 91 %; 32768x65535 only 13.0 -> 9.2 ms (62 %: its rows do not
fit); overall 0.80x -> 1.14x the eager reference.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/AccumulateType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float inv_norm(float sumsq) {
    return sumsq > 0.f ? rsqrtf(sumsq) : 0.f;
}
__device__ __forceinline__ double inv_norm(double sumsq) {
    return sumsq > 0.0 ? rsqrt(sumsq) : 0.0;
}

template <typename scalar_t, int THREADS, int K>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS)
l2norm_rows(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int dim, int64_t ldx) {
    using acc_t = at::acc_type<scalar_t, true>;
    constexpr int kWarps = THREADS / 32;
    const int tid = threadIdx.x;
    const scalar_t* row_in = x + (int64_t)blockIdx.x * ldx;
    scalar_t* row_out = y + (int64_t)blockIdx.x * dim;

    // Phase 1: read this thread's K elements (element tid + k * THREADS) into registers.
    acc_t v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int i = tid + k * THREADS;
        v[k] = i < dim ? static_cast<acc_t>(row_in[i]) : acc_t(0);
    }
    acc_t sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) sum += v[k] * v[k];
    // Elements beyond the registers: read here and again below.
    for (int i = tid + K * THREADS; i < dim; i += THREADS) {
        const acc_t e = static_cast<acc_t>(row_in[i]);
        sum += e * e;
    }

    __shared__ acc_t partial[kWarps];
    sum = warp_sum(sum);
    if ((tid & 31) == 0) partial[tid >> 5] = sum;
    __syncthreads();
    acc_t total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += partial[w];
    const acc_t inv = inv_norm(total);

    // Phase 2: scale the registers; no second read of x for them.
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int i = tid + k * THREADS;
        if (i < dim) row_out[i] = static_cast<scalar_t>(v[k] * inv);
    }
    for (int i = tid + K * THREADS; i < dim; i += THREADS) {
        row_out[i] = static_cast<scalar_t>(static_cast<acc_t>(row_in[i]) * inv);
    }
}

template <typename scalar_t, int THREADS, int K>
static void launch(const torch::Tensor& in, torch::Tensor& out, int64_t rows, int dim,
                   int64_t ldx, cudaStream_t stream) {
    l2norm_rows<scalar_t, THREADS, K><<<(unsigned)rows, THREADS, 0, stream>>>(
        in.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), dim, ldx);
}

torch::Tensor l2norm_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "l2norm_v4: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "l2norm_v4: x must be 2-D (batch, dim), got ", x.dim(), "-D");
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t rows = x.size(0), dim = x.size(1);
    auto out = torch::empty({rows, dim}, x.options().memory_format(at::MemoryFormat::Contiguous));
    if (x.numel() == 0) return out;
    TORCH_CHECK(rows <= 2147483647LL, "l2norm_v4: batch above 2^31 - 1 is not supported");
    TORCH_CHECK(dim <= 2147483647LL - 65536, "l2norm_v4: rows longer than 2^31 - 65537 elements");
    // Rows must be contiguous; the row stride may be anything (a slice x[:, a:b] is read in place).
    torch::Tensor in = x;
    int64_t ldx = rows == 1 ? dim : x.stride(0);
    if (!((x.stride(1) == 1 || dim == 1) && x.stride(0) >= 0)) {
        in = x.contiguous();
        ldx = dim;
    }
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                    x.scalar_type(), "l2norm_v4", [&] {
        if (dim <= 1024) launch<scalar_t, 128, 8>(in, out, rows, (int)dim, ldx, stream);
        else if (dim <= 4096) launch<scalar_t, 256, 16>(in, out, rows, (int)dim, ldx, stream);
        else launch<scalar_t, 512, 32>(in, out, rows, (int)dim, ldx, stream);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = "torch::Tensor l2norm_forward(torch::Tensor x);"

l2norm = load_inline(
    name="l2norm_v4",
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
