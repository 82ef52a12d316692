"""softmax(x / temperature) along rows, in one kernel: one CTA per row, each thread keeps a
running maximum and a sum of exponentials scaled to it (the online softmax), the CTA merges
them, and a second sweep over the row (mostly from L2) writes the result. Eager PyTorch
writes x / temperature to memory and reads it back for the softmax; this reads x and writes
y. float32, contiguous rows (others are copied once)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

constexpr int THREADS = 512;

__device__ __forceinline__ void merge(float& m, float& s, float om, float os) {
    float top = fmaxf(m, om);
    float a = (m == -INFINITY) ? 0.f : s * expf(m - top);
    float b = (om == -INFINITY) ? 0.f : os * expf(om - top);
    m = top;
    s = a + b;
}

__device__ __forceinline__ void add(float& m, float& s, float v) {
    if (v > m) {
        s = (m == -INFINITY ? 0.f : s * expf(m - v)) + 1.f;
        m = v;
    } else {
        s += expf(v - m);
    }
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t dim,
                             float scale, bool vec) {
    const float* row = x + blockIdx.x * dim;
    float* out = y + blockIdx.x * dim;
    float m = -INFINITY, s = 0.f;
    if (vec) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        for (int64_t i = threadIdx.x; i < dim / 4; i += THREADS) {
            float4 v = r4[i];
            add(m, s, v.x * scale); add(m, s, v.y * scale);
            add(m, s, v.z * scale); add(m, s, v.w * scale);
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += THREADS) add(m, s, row[i] * scale);
    }
    for (int off = 16; off > 0; off >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, m, off);
        float os = __shfl_xor_sync(0xffffffffu, s, off);
        merge(m, s, om, os);
    }
    __shared__ float wm[THREADS / 32], ws[THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { wm[warp] = m; ws[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < THREADS / 32 ? wm[lane] : -INFINITY;
        s = lane < THREADS / 32 ? ws[lane] : 0.f;
        for (int off = 16; off > 0; off >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, m, off);
            float os = __shfl_xor_sync(0xffffffffu, s, off);
            merge(m, s, om, os);
        }
        if (lane == 0) { wm[0] = m; ws[0] = s; }
    }
    __syncthreads();
    m = wm[0];
    const float inv = 1.f / ws[0];
    if (vec) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        float4* o4 = reinterpret_cast<float4*>(out);
        for (int64_t i = threadIdx.x; i < dim / 4; i += THREADS) {
            float4 v = r4[i];
            o4[i] = make_float4(expf(v.x * scale - m) * inv, expf(v.y * scale - m) * inv,
                                expf(v.z * scale - m) * inv, expf(v.w * scale - m) * inv);
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += THREADS)
            out[i] = expf(row[i] * scale - m) * inv;
    }
}

torch::Tensor softmax_forward(torch::Tensor x, double temperature) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto in = x.contiguous();
    auto y = torch::empty_like(in);
    const int64_t dim = in.size(-1);
    const int64_t rows = dim == 0 ? 0 : in.numel() / dim;
    if (rows == 0) return y;
    TORCH_CHECK(rows < (1LL << 31), "too many rows");
    const bool aligned = reinterpret_cast<uintptr_t>(in.data_ptr<float>()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    const c10::cuda::CUDAGuard guard(in.device());
    auto stream = at::cuda::getCurrentCUDAStream();
    // The float4 path needs 16-byte aligned rows: dim % 4 == 0 and an aligned base.
    softmax_rows<<<rows, THREADS, 0, stream>>>(in.data_ptr<float>(), y.data_ptr<float>(), dim,
                                               1.0f / (float)temperature,
                                               aligned && dim % 4 == 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor softmax_forward(torch::Tensor x, double temperature);"

softmax = load_inline(name="softmax_cuda_v1", cpp_sources=cpp_source, cuda_sources=cuda_source,
                      functions=["softmax_forward"], extra_cuda_cflags=["-O3"], verbose=True)


class ModelNew(nn.Module):
    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax.softmax_forward(x, self.temperature)
