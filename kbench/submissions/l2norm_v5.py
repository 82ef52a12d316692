"""L2 normalisation, step 5: 16-byte vector loads and stores, with a scalar peel per row.

Changed from v4: v4 moves 4 bytes (float32) or 2 bytes (float16, bfloat16) per load and
store instruction. v5 moves 16 bytes: each thread keeps K = 4 or 8 vectors of 16 bytes (uint4)
in registers, raw, and converts them to float32 (float64 for float64) only to sum the squares
and to scale. One warp instruction then covers 512 bytes, four to eight times fewer load and
store instructions and address computations, and twice the bytes in flight per register
(the registers hold the input type, not float32, for 16-bit inputs).

16-byte accesses need 16-byte addresses, and rows do not start on them: row r starts r * dim
elements after x, so with dim = 65535 float32 every row is misaligned differently. Each row is
split into a scalar head (the up to 3 float32 / 7 16-bit elements before the first 16-byte
boundary), a body of whole vectors, and a scalar tail; head and tail go through scalar loads
and stores. y is a fresh 16-byte-aligned tensor, so body vectors of x and y line up whenever x
itself is 16-byte aligned and its row stride keeps the phase (true for every contiguous x from
the caching allocator); any other x (a misaligned view, a transposed tensor) is copied once.

Launch as in v4: one CTA per row, 128 x 4, 128 x 8, 256 x 8 or 512 x 8 vectors (at most
4096 vectors = 64 KB of float32, 32768 16-bit elements, held in registers). Longer rows still
re-read the part beyond the registers; v6 splits them.

What it bought (kbench, H100 80GB HBM3, run seed 496937219; full table in docs/l2norm-kernels.md):
little for float32: 65536x1024 98 -> 99 % of copy, 32768x65535 9.2 -> 8.2 ms (62 -> 70 %, the
re-read is cheaper), but 8192x8192 98 -> 93 % and 4096x4096 91 -> 86 % (its float32 kernels
spill 24 bytes a thread); overall 1.14x -> 1.15x eager.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// 16-byte packs: N elements of T in one uint4, accumulated in acc.
template <typename T> struct Pack;

template <> struct Pack<float> {
    using acc = float;
    static constexpr int N = 4;
    __device__ __forceinline__ static float sumsq(uint4 u) {
        const float a = __uint_as_float(u.x), b = __uint_as_float(u.y);
        const float c = __uint_as_float(u.z), d = __uint_as_float(u.w);
        return fmaf(a, a, fmaf(b, b, fmaf(c, c, d * d)));
    }
    __device__ __forceinline__ static uint4 scale(uint4 u, float s) {
        return make_uint4(__float_as_uint(__uint_as_float(u.x) * s),
                          __float_as_uint(__uint_as_float(u.y) * s),
                          __float_as_uint(__uint_as_float(u.z) * s),
                          __float_as_uint(__uint_as_float(u.w) * s));
    }
};

template <> struct Pack<double> {
    using acc = double;
    static constexpr int N = 2;
    __device__ __forceinline__ static double sumsq(uint4 u) {
        const double a = __hiloint2double((int)u.y, (int)u.x);
        const double b = __hiloint2double((int)u.w, (int)u.z);
        return fma(a, a, b * b);
    }
    __device__ __forceinline__ static uint4 scale(uint4 u, double s) {
        const double a = __hiloint2double((int)u.y, (int)u.x) * s;
        const double b = __hiloint2double((int)u.w, (int)u.z) * s;
        return make_uint4((unsigned)__double2loint(a), (unsigned)__double2hiint(a),
                          (unsigned)__double2loint(b), (unsigned)__double2hiint(b));
    }
};

struct HalfWord {  // two float16 in one 32-bit word
    __device__ __forceinline__ static float lo(unsigned w) {
        return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    }
    __device__ __forceinline__ static float hi(unsigned w) {
        return __half2float(__ushort_as_half((unsigned short)(w >> 16)));
    }
    __device__ __forceinline__ static unsigned pack(float a, float b) {
        return (unsigned)__half_as_ushort(__float2half_rn(a)) |
               ((unsigned)__half_as_ushort(__float2half_rn(b)) << 16);
    }
};

struct BFloatWord {  // two bfloat16 in one 32-bit word
    __device__ __forceinline__ static float lo(unsigned w) { return __uint_as_float(w << 16); }
    __device__ __forceinline__ static float hi(unsigned w) {
        return __uint_as_float(w & 0xffff0000u);
    }
    __device__ __forceinline__ static unsigned pack(float a, float b) {
        return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
               ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
    }
};

template <typename W> struct Pack16 {  // 8 sixteen-bit floats
    using acc = float;
    static constexpr int N = 8;
    __device__ __forceinline__ static float word(unsigned w) {
        const float a = W::lo(w), b = W::hi(w);
        return fmaf(a, a, b * b);
    }
    __device__ __forceinline__ static float sumsq(uint4 u) {
        return (word(u.x) + word(u.y)) + (word(u.z) + word(u.w));
    }
    __device__ __forceinline__ static unsigned sword(unsigned w, float s) {
        return W::pack(W::lo(w) * s, W::hi(w) * s);
    }
    __device__ __forceinline__ static uint4 scale(uint4 u, float s) {
        return make_uint4(sword(u.x, s), sword(u.y, s), sword(u.z, s), sword(u.w, s));
    }
};
template <> struct Pack<at::Half> : Pack16<HalfWord> {};
template <> struct Pack<at::BFloat16> : Pack16<BFloatWord> {};

__device__ __forceinline__ float inv_norm(float sumsq) {
    return sumsq > 0.f ? rsqrtf(sumsq) : 0.f;
}
__device__ __forceinline__ double inv_norm(double sumsq) {
    return sumsq > 0.0 ? rsqrt(sumsq) : 0.0;
}

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}


// Where the 16-byte body of a row starts (head scalars before it), its vector count, and the
// scalar tail after it. head < N and tail < N.
template <typename T>
struct RowSplit {
    int head, nvec, tail;
    __device__ __forceinline__ RowSplit(const T* row, int dim) {  // dim < 2^31 (host checks)
        constexpr int N = Pack<T>::N;
        const int mis = (int)((reinterpret_cast<uintptr_t>(row) & 15u) / sizeof(T));
        head = mis ? min(N - mis, dim) : 0;
        nvec = (dim - head) / N;
        tail = dim - head - nvec * N;
    }
};

// One CTA per row; thread t keeps body vectors t + k * THREADS (k < K) in registers.
template <typename T, int THREADS, int K>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS)
l2norm_rows(const T* __restrict__ x, T* __restrict__ y, int dim, int64_t ldx) {
    using P = Pack<T>;
    using acc_t = typename P::acc;
    constexpr int N = P::N;
    constexpr int kWarps = THREADS / 32;
    const int tid = threadIdx.x;
    const T* xr = x + (int64_t)blockIdx.x * ldx;
    T* yr = y + (int64_t)blockIdx.x * dim;
    const RowSplit<T> rs(xr, dim);
    const uint4* xv = reinterpret_cast<const uint4*>(xr + rs.head);  // 16-byte aligned
    uint4* yv = reinterpret_cast<uint4*>(yr + rs.head);
    // How many of this thread's K vectors exist in this row.
    const int mine = rs.nvec - tid;
    const int count = mine <= 0 ? 0 : min((mine + THREADS - 1) / THREADS, K);

    uint4 r[K];
#pragma unroll
    for (int k = 0; k < K; ++k) if (k < count) r[k] = __ldg(xv + tid + k * THREADS);
    acc_t s = 0;
    if (tid < rs.head) { const acc_t v = static_cast<acc_t>(xr[tid]); s += v * v; }
    if (tid < rs.tail) {
        const acc_t v = static_cast<acc_t>(xr[rs.head + rs.nvec * N + tid]);
        s += v * v;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) if (k < count) s += P::sumsq(r[k]);
    // Vectors beyond the registers: read here and again below.
    for (int i = tid + K * THREADS; i < rs.nvec; i += THREADS) s += P::sumsq(__ldg(xv + i));

    __shared__ acc_t partial[kWarps];
    s = warp_sum(s);
    if ((tid & 31) == 0) partial[tid >> 5] = s;
    __syncthreads();
    acc_t total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += partial[w];
    const acc_t inv = inv_norm(total);

#pragma unroll
    for (int k = 0; k < K; ++k) if (k < count) yv[tid + k * THREADS] = P::scale(r[k], inv);
    for (int i = tid + K * THREADS; i < rs.nvec; i += THREADS) yv[i] = P::scale(__ldg(xv + i), inv);
    if (tid < rs.head) yr[tid] = static_cast<T>(static_cast<acc_t>(xr[tid]) * inv);
    if (tid < rs.tail) {
        const int j = rs.head + rs.nvec * N + tid;
        yr[j] = static_cast<T>(static_cast<acc_t>(xr[j]) * inv);
    }
}

template <typename T, int THREADS, int K>
static void launch(const T* x, T* y, int64_t rows, int dim, int64_t ldx, cudaStream_t stream) {
    l2norm_rows<T, THREADS, K><<<(unsigned)rows, THREADS, 0, stream>>>(x, y, dim, ldx);
}

// Rows must be contiguous along dim 1, and x and y must share their 16-byte phase row by row
// (so that a vector of x maps onto a vector of y). Otherwise copy x once.
static torch::Tensor prepare(const torch::Tensor& x, int64_t& ldx) {
    const int64_t rows = x.size(0), dim = x.size(1);
    bool ok = (x.stride(1) == 1 || dim == 1) && x.stride(0) >= 0;
    ldx = rows == 1 ? dim : x.stride(0);
    if (ok) {
        const auto addr = reinterpret_cast<uintptr_t>(x.data_ptr());
        ok = addr % 16 == 0 && (rows == 1 || ((ldx - dim) * (int64_t)x.element_size()) % 16 == 0);
    }
    if (ok) return x;
    ldx = dim;
    auto copy = x.contiguous();
    if (copy.data_ptr() == x.data_ptr()) {  // x was contiguous but misaligned
        copy = x.clone(at::MemoryFormat::Contiguous);
    }
    return copy;
}

torch::Tensor l2norm_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "l2norm_v5: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "l2norm_v5: x must be 2-D (batch, dim), got ", x.dim(), "-D");
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t rows = x.size(0), dim = x.size(1);
    auto y = torch::empty({rows, dim}, x.options().memory_format(at::MemoryFormat::Contiguous));
    if (x.numel() == 0) return y;
    TORCH_CHECK(rows <= 2147483647LL, "l2norm_v5: batch above 2^31 - 1 is not supported");
    TORCH_CHECK(dim <= 2147483647LL - 65536, "l2norm_v5: rows longer than 2^31 - 65537 elements");
    int64_t ldx = dim;
    auto input = prepare(x, ldx);
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                    x.scalar_type(), "l2norm_v5", [&] {
        const int64_t nvec = dim / Pack<scalar_t>::N;
        const scalar_t* xp = input.data_ptr<scalar_t>();
        scalar_t* yp = y.data_ptr<scalar_t>();
        const int d = (int)dim;
        if (nvec <= 512) launch<scalar_t, 128, 4>(xp, yp, rows, d, ldx, stream);
        else if (nvec <= 1024) launch<scalar_t, 128, 8>(xp, yp, rows, d, ldx, stream);
        else if (nvec <= 2048) launch<scalar_t, 256, 8>(xp, yp, rows, d, ldx, stream);
        else launch<scalar_t, 512, 8>(xp, yp, rows, d, ldx, stream);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor l2norm_forward(torch::Tensor x);"

l2norm = load_inline(
    name="l2norm_v5",
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
