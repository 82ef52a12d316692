"""L2 normalisation, step 6: shape-adaptive launch; long and few rows split over several CTAs.

Changed from v5: v5 gives every row one CTA of at most 512 threads x 8 vectors (64 KB of
float32) and re-reads whatever does not fit. v6 chooses the launch from the shape:

- short rows (up to 256 vectors of 16 bytes, 1024 float32): a warp, or a group of 1-16 lanes,
  per row, so a 256-thread block handles 8 to 256 rows and no thread waits on a block barrier;
- medium rows: one CTA per row, 128-512 threads, the row in registers as in v5;
- long rows (32768 x 65535: 256 KB a row, more than an SM's registers or shared memory hold)
  and few-row shapes (16 x 16384 would give 16 CTAs for 132 SMs): each row is split over a
  thread-block cluster of 2-16 CTAs (sm_90). Every CTA keeps its slice of the row in registers,
  puts its partial sum of squares in shared memory, and after one cluster barrier reads the
  others' partial sums through distributed shared memory (DSMEM). x is still read once;
- a row too long for one cluster with too few rows to fill the GPU (1 x 1048576, 4 MB): a
  cooperative launch of co-resident CTAs (cudaLaunchCooperativeKernel), each holding a slice
  of the row in registers; partial sums go to a small global buffer and meet after one grid
  barrier (cooperative_groups::this_grid().sync()). One kernel, x read once.

Shapes that fit none of these (rows too long for a cluster and too many of them for one
co-resident grid) keep v5's fallback: the part of a slice beyond the registers is read twice.
Without sm_90 (no clusters) long or few rows use the cooperative grid or that fallback.

Kept from v5: 16-byte loads and stores of the row body, a scalar peel of the elements before
the first 16-byte boundary of each row (a row of 65535 float32 starts anywhere mod 16 bytes)
and of the tail; float32 accumulation for float16 and bfloat16 (float64 for float64); 64-bit
offsets; zero rows give zeros; inputs whose rows are contiguous (stride 1 along dim 1) are read
in place with their row stride when the 16-byte phase of x and y agree, anything else is copied
once. Loads of data held in registers use the streaming hint (ld.global.cs) and all stores
st.global.cs, since nothing is read again.

What it bought (kbench, H100 80GB HBM3, run seed 496937219; full table in docs/l2norm-kernels.md):
32768x65535 8.2 -> 6.07 ms (70 -> 94 % of copy, 1.65x eager), 1x1048576 0.151 -> 0.0141 ms
(0.13x -> 1.41x eager); overall 1.15x -> 1.73x eager, 1.46x torch.compile.

`l2norm_config(x, mode, threads, vecs, splits, lanes, flags)` runs one forced launch
configuration (mode 0 warp/group per row, 1 CTA or cluster per row, 2 cooperative grid); it is
what bench/l2norm_dev.py sweeps to choose the thresholds below.
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
#include <cooperative_groups.h>
#include <cstdint>

namespace cg = cooperative_groups;

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
    // xor butterfly: every lane ends with the same value (a + b == b + a exactly).
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

enum : int { kLoadStreaming = 1, kStoreStreaming = 2 };

// The vectors a thread keeps in registers: r[k] = p[k * stride] for k < count (count <= K).
// The cache hint is chosen once, outside the unrolled loops.
template <int K>
__device__ __forceinline__ void load_regs(uint4 (&r)[K], const uint4* p, int stride, int count,
                                          int flags) {
    if (flags & kLoadStreaming) {
#pragma unroll
        for (int k = 0; k < K; ++k) if (k < count) r[k] = __ldcs(p + k * stride);
    } else {
#pragma unroll
        for (int k = 0; k < K; ++k) if (k < count) r[k] = __ldg(p + k * stride);
    }
}

template <typename P, int K>
__device__ __forceinline__ typename P::acc sumsq_regs(const uint4 (&r)[K], int count) {
    typename P::acc s = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) if (k < count) s += P::sumsq(r[k]);
    return s;
}

template <typename P, int K>
__device__ __forceinline__ void store_regs(const uint4 (&r)[K], uint4* p, int stride, int count,
                                           typename P::acc inv, int flags) {
    if (flags & kStoreStreaming) {
#pragma unroll
        for (int k = 0; k < K; ++k) if (k < count) __stcs(p + k * stride, P::scale(r[k], inv));
    } else {
#pragma unroll
        for (int k = 0; k < K; ++k) if (k < count) p[k * stride] = P::scale(r[k], inv);
    }
}

// How many of a thread's K strided vectors fall inside a range of n vectors it starts at.
__device__ __forceinline__ int vec_count(int n, int stride, int K) {
    return n <= 0 ? 0 : min((n + stride - 1) / stride, K);
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

enum : int { kModeGroup = 0, kModeCta = 1, kModeGrid = 2 };

// ---------------------------------------------------------------------------------------------
// Short rows: LANES (1..32, a power of two) lanes per row, 8 warps per block, K vectors a lane.
template <typename T, int K>
__global__ void __launch_bounds__(256, 4)
l2norm_group_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int dim,
                  int64_t ldx, int lanes, int flags) {
    using P = Pack<T>;
    using acc_t = typename P::acc;
    constexpr int N = P::N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gl = lane & (lanes - 1);
    const int64_t row = ((int64_t)blockIdx.x * 8 + warp) * (32 / lanes) + lane / lanes;
    const bool active = row < rows;
    const T* xr = x + (active ? row : 0) * ldx;
    T* yr = y + (active ? row : 0) * (int64_t)dim;
    const RowSplit<T> rs(xr, dim);
    const int nvec = active ? rs.nvec : 0;
    const int head = active ? rs.head : 0, tail = active ? rs.tail : 0;
    const uint4* xv = reinterpret_cast<const uint4*>(xr + rs.head);
    uint4* yv = reinterpret_cast<uint4*>(yr + rs.head);
    const T* xt = xr + rs.head + rs.nvec * N;
    T* yt = yr + rs.head + rs.nvec * N;

    const int count = vec_count(nvec - gl, lanes, K);
    uint4 r[K];
    load_regs<K>(r, xv + gl, lanes, count, flags);
    acc_t s = sumsq_regs<P, K>(r, count);
    for (int i = K * lanes + gl; i < nvec; i += lanes) s += P::sumsq(__ldg(xv + i));
    for (int j = gl; j < head; j += lanes) {
        const acc_t v = static_cast<acc_t>(xr[j]);
        s += v * v;
    }
    for (int j = gl; j < tail; j += lanes) {
        const acc_t v = static_cast<acc_t>(xt[j]);
        s += v * v;
    }
    for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, offset);  // stays inside each group of lanes
    }
    const acc_t inv = inv_norm(s);

    store_regs<P, K>(r, yv + gl, lanes, count, inv, flags);
    for (int i = K * lanes + gl; i < nvec; i += lanes)
        yv[i] = P::scale(__ldg(xv + i), inv);
    for (int j = gl; j < head; j += lanes) yr[j] = static_cast<T>(static_cast<acc_t>(xr[j]) * inv);
    for (int j = gl; j < tail; j += lanes) yt[j] = static_cast<T>(static_cast<acc_t>(xt[j]) * inv);
}

// ---------------------------------------------------------------------------------------------
// Medium and long rows: `splits` CTAs per row (blockIdx.x = row * splits + split). Each CTA
// holds up to THREADS * K vectors of its slice in registers. The CTAs of one row meet through
// DSMEM (mode kModeCta with splits > 1, launched as a cluster of `splits` CTAs) or through a
// global buffer and a grid barrier (mode kModeGrid, cooperative launch).
template <typename T, int THREADS, int K>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS)
l2norm_split_rows(const T* __restrict__ x, T* __restrict__ y, int dim, int64_t ldx,
                  int splits, int mode, typename Pack<T>::acc* __restrict__ partials, int flags) {
    using P = Pack<T>;
    using acc_t = typename P::acc;
    constexpr int N = P::N;
    constexpr int kWarps = THREADS / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t row = blockIdx.x / splits;
    const int split = (int)(blockIdx.x - row * splits);
    const T* xr = x + row * ldx;
    T* yr = y + row * (int64_t)dim;
    const RowSplit<T> rs(xr, dim);
    const uint4* xv = reinterpret_cast<const uint4*>(xr + rs.head);
    uint4* yv = reinterpret_cast<uint4*>(yr + rs.head);
    const T* xt = xr + rs.head + rs.nvec * N;
    T* yt = yr + rs.head + rs.nvec * N;
    const int per = (rs.nvec + splits - 1) / splits;
    const int v0 = (int)min64((int64_t)split * per, rs.nvec);
    const int v1 = (int)min64((int64_t)v0 + per, rs.nvec);
    const bool first = split == 0, last = split == splits - 1;

    const int count = vec_count(v1 - v0 - tid, THREADS, K);
    uint4 r[K];
    load_regs<K>(r, xv + v0 + tid, THREADS, count, flags);
    acc_t s = sumsq_regs<P, K>(r, count);
    if (first && tid < rs.head) { const acc_t v = static_cast<acc_t>(xr[tid]); s += v * v; }
    if (last && tid < rs.tail) { const acc_t v = static_cast<acc_t>(xt[tid]); s += v * v; }
    // Beyond the registers (only for shapes no cluster or grid can hold): read now, again below.
    for (int i = v0 + K * THREADS + tid; i < v1; i += THREADS) s += P::sumsq(__ldg(xv + i));

    __shared__ acc_t warp_part[kWarps];
    __shared__ acc_t cta_part;
    s = warp_sum(s);
    if (lane == 0) warp_part[warp] = s;
    __syncthreads();
    acc_t total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_part[w];

    if (splits > 1) {
        if (mode == kModeCta) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            cg::cluster_group cluster = cg::this_cluster();
            if (tid == 0) cta_part = total;
            cluster.sync();  // cta_part of every CTA of the row is written
            acc_t t = lane < splits ? *cluster.map_shared_rank(&cta_part, lane) : acc_t(0);
            total = warp_sum(t);
            cluster.barrier_arrive();  // done reading the others; waited for before exiting
#else
            __trap();  // the host launches clusters only on sm_90 and newer
#endif
        } else {
            if (tid == 0) partials[row * splits + split] = total;
            cg::this_grid().sync();
            acc_t t = 0;
            for (int j = lane; j < splits; j += 32) t += __ldcg(partials + row * splits + j);
            total = warp_sum(t);
        }
    }
    const acc_t inv = inv_norm(total);

    store_regs<P, K>(r, yv + v0 + tid, THREADS, count, inv, flags);
    for (int i = v0 + K * THREADS + tid; i < v1; i += THREADS)
        yv[i] = P::scale(__ldg(xv + i), inv);
    if (first && tid < rs.head) yr[tid] = static_cast<T>(static_cast<acc_t>(xr[tid]) * inv);
    if (last && tid < rs.tail) yt[tid] = static_cast<T>(static_cast<acc_t>(xt[tid]) * inv);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (splits > 1 && mode == kModeCta) cg::this_cluster().barrier_wait();  // keep cta_part alive
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side.
struct Config {
    int mode, threads, vecs, splits, lanes, flags;
};

struct Device {
    int sms = 0, major = 0;
};

static Device device_info(int index) {
    Device d;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, index));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, index));
    return d;
}

template <typename T, int THREADS, int K>
static void launch_split(const T* x, T* y, int64_t rows, int dim, int64_t ldx,
                         const Config& c, const torch::Tensor& like, cudaStream_t stream) {
    using acc_t = typename Pack<T>::acc;
    auto kernel = l2norm_split_rows<T, THREADS, K>;
    const int splits = c.splits;
    const int64_t blocks = rows * splits;
    TORCH_CHECK(blocks <= 2147483647LL, "l2norm_v6: too many CTAs (", blocks, ")");
    if (splits == 1) {
        kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(x, y, dim, ldx, 1, kModeCta, nullptr,
                                                         c.flags);
    } else if (c.mode == kModeCta) {
        if (splits > 8) {
            C10_CUDA_CHECK(cudaFuncSetAttribute(
                kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        }
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)blocks);
        cfg.blockDim = dim3(THREADS);
        cfg.dynamicSmemBytes = 0;
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)splits;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, x, y, dim, ldx, splits, (int)kModeCta,
                                          (acc_t*)nullptr, c.flags));
    } else {
        auto partials = torch::empty({blocks}, like.options().dtype(
            std::is_same<acc_t, double>::value ? torch::kFloat64 : torch::kFloat32));
        acc_t* pp = partials.data_ptr<acc_t>();
        int mode = kModeGrid, flags = c.flags;
        void* args[] = {(void*)&x, (void*)&y, (void*)&dim, (void*)&ldx, (void*)&splits,
                        (void*)&mode, (void*)&pp, (void*)&flags};
        C10_CUDA_CHECK(cudaLaunchCooperativeKernel((const void*)kernel, dim3((unsigned)blocks),
                                                   dim3(THREADS), args, 0, stream));
    }
}

template <typename T>
static int grid_capacity(int threads, int vecs, int sms) {  // co-resident CTAs, whole GPU
    int per_sm = 0;
    const void* fn = nullptr;
    if (threads == 128 && vecs == 4) fn = (const void*)l2norm_split_rows<T, 128, 4>;
    else if (threads == 128) fn = (const void*)l2norm_split_rows<T, 128, 8>;
    else if (threads == 256 && vecs == 4) fn = (const void*)l2norm_split_rows<T, 256, 4>;
    else if (threads == 256) fn = (const void*)l2norm_split_rows<T, 256, 8>;
    else if (vecs == 4) fn = (const void*)l2norm_split_rows<T, 512, 4>;
    else fn = (const void*)l2norm_split_rows<T, 512, 8>;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, 0));
    return per_sm * sms;
}

template <typename T>
static void launch(const T* x, T* y, int64_t rows, int dim, int64_t ldx, const Config& c,
                   const torch::Tensor& like, cudaStream_t stream) {
    if (c.mode == kModeGroup) {
        const int64_t per_block = 8 * (32 / c.lanes);
        const int64_t blocks = (rows + per_block - 1) / per_block;
        TORCH_CHECK(blocks <= 2147483647LL, "l2norm_v6: too many blocks");
        if (c.vecs <= 4)
            l2norm_group_rows<T, 4><<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, dim, ldx,
                                                                          c.lanes, c.flags);
        else
            l2norm_group_rows<T, 8><<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, dim, ldx,
                                                                          c.lanes, c.flags);
        return;
    }
#define L2N_SPLIT(TH, KV) launch_split<T, TH, KV>(x, y, rows, dim, ldx, c, like, stream)
    if (c.threads == 128) { if (c.vecs <= 4) L2N_SPLIT(128, 4); else L2N_SPLIT(128, 8); }
    else if (c.threads == 256) { if (c.vecs <= 4) L2N_SPLIT(256, 4); else L2N_SPLIT(256, 8); }
    else { if (c.vecs <= 4) L2N_SPLIT(512, 4); else L2N_SPLIT(512, 8); }
#undef L2N_SPLIT
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int pow2_at_least(int64_t v) { int p = 1; while (p < v) p <<= 1; return p; }

// The launch for a shape. Sizes are in 16-byte vectors, so one rule serves every dtype.
template <typename T>
static Config choose(int64_t rows, int64_t dim, const Device& dev) {
    constexpr int N = Pack<T>::N;
    const int64_t nvec = dim / N;
    const int flags = kLoadStreaming | kStoreStreaming;
    const int max_cluster = dev.major >= 9 ? 8 : 1;
    const int64_t fill = 2LL * dev.sms;  // CTAs wanted in flight at once, at least

    // Short rows: a group of lanes per row, 4 or 8 vectors a lane.
    if (nvec <= 256) {
        const int vecs = nvec > 128 ? 8 : 4;
        const int64_t per_lane = std::max<int64_t>(1, ceil_div(nvec, vecs));
        const int lanes = (int)std::min<int64_t>(32, pow2_at_least(per_lane));
        return {kModeGroup, 256, vecs, 1, lanes, flags};
    }
    // CTAs per row: enough to hold the row in registers (512 threads x 8 vectors each), and
    // for few rows enough CTAs to fill the GPU, keeping >= 512 vectors (8 KB) per CTA.
    int64_t splits = ceil_div(nvec, 4096);
    while (rows * splits < fill && ceil_div(nvec, splits * 2) >= 512) splits *= 2;
    if (splits <= max_cluster) {
        const int64_t per = ceil_div(nvec, splits);
        int threads = 512, vecs = 8;
        if (per <= 512) { threads = 128; vecs = 4; }
        else if (per <= 1024) { threads = 128; vecs = 8; }
        else if (per <= 2048) { threads = 256; vecs = 8; }
        return {kModeCta, threads, vecs, (int)splits, 1, flags};
    }
    // Too long for one cluster: a cooperative grid when the whole split fits on the GPU at once.
    const int threads = 256, vecs = 8;
    splits = std::max<int64_t>(splits, ceil_div(nvec, (int64_t)threads * vecs));
    const int64_t capacity = grid_capacity<T>(threads, vecs, dev.sms);
    if (rows * splits <= capacity) {
        if (rows == 1) splits = std::max<int64_t>(splits, std::min<int64_t>(capacity, fill));
        return {kModeGrid, threads, vecs, (int)splits, 1, flags};
    }
    // Otherwise the largest cluster (or one CTA) per row; the rest of each slice is read twice.
    return {kModeCta, 512, 8, max_cluster, 1, flags};
}

// Rows must be contiguous along dim 1; x and y must agree on their 16-byte phase row by row
// (so a vector of x maps onto a vector of y). Otherwise copy x once.
static torch::Tensor prepare(const torch::Tensor& x, int64_t& ldx) {
    const int64_t rows = x.size(0), dim = x.size(1);
    const int64_t esize = x.element_size();
    bool ok = (x.stride(1) == 1 || dim == 1) && x.stride(0) >= 0;
    ldx = rows == 1 ? dim : x.stride(0);
    if (ok) {
        const auto addr = reinterpret_cast<uintptr_t>(x.data_ptr());
        ok = addr % 16 == 0 && (rows == 1 || ((ldx - dim) * esize) % 16 == 0);
    }
    if (ok) return x;
    ldx = dim;
    auto copy = x.contiguous();
    if (copy.data_ptr() == x.data_ptr()) {  // x was contiguous but misaligned
        copy = x.clone(at::MemoryFormat::Contiguous);
    }
    return copy;
}

static torch::Tensor run(torch::Tensor x, const Config* forced) {
    TORCH_CHECK(x.is_cuda(), "l2norm_v6: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "l2norm_v6: x must be 2-D (batch, dim), got ", x.dim(), "-D");
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t rows = x.size(0), dim = x.size(1);
    auto y = torch::empty({rows, dim}, x.options().memory_format(at::MemoryFormat::Contiguous));
    if (x.numel() == 0) return y;
    TORCH_CHECK(dim <= 2147483647LL - 65536, "l2norm_v6: rows longer than 2^31 - 65537 elements");
    int64_t ldx = dim;
    auto input = prepare(x, ldx);
    const Device dev = device_info(x.get_device());
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                    x.scalar_type(), "l2norm_v6", [&] {
        const Config c = forced ? *forced : choose<scalar_t>(rows, dim, dev);
        TORCH_CHECK(c.mode != kModeCta || c.splits == 1 || dev.major >= 9,
                    "l2norm_v6: thread-block clusters need sm_90 or newer");
        TORCH_CHECK(c.mode != kModeGrid || c.splits == 1 ||
                    rows * c.splits <= grid_capacity<scalar_t>(c.threads, c.vecs, dev.sms),
                    "l2norm_v6: more CTAs than can be co-resident for a grid barrier");
        launch<scalar_t>(input.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows, (int)dim, ldx, c,
                         x, stream);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

torch::Tensor l2norm_forward(torch::Tensor x) { return run(x, nullptr); }

torch::Tensor l2norm_config(torch::Tensor x, int64_t mode, int64_t threads, int64_t vecs,
                            int64_t splits, int64_t lanes, int64_t flags) {
    TORCH_CHECK(mode >= 0 && mode <= 2 && (threads == 128 || threads == 256 || threads == 512) &&
                (vecs == 4 || vecs == 8) && splits >= 1 && lanes >= 1 && lanes <= 32 &&
                (lanes & (lanes - 1)) == 0, "l2norm_config: bad configuration");
    const Config c{(int)mode, (int)threads, (int)vecs, (int)splits, (int)lanes, (int)flags};
    return run(x, &c);
}

std::vector<int64_t> l2norm_choice(torch::Tensor x) {
    const Device dev = device_info(x.get_device());
    Config c{};
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                    x.scalar_type(), "l2norm_v6", [&] {
        c = choose<scalar_t>(x.size(0), x.size(1), dev);
    });
    return {c.mode, c.threads, c.vecs, c.splits, c.lanes, c.flags};
}
"""

cpp_source = r"""
torch::Tensor l2norm_forward(torch::Tensor x);
torch::Tensor l2norm_config(torch::Tensor x, int64_t mode, int64_t threads, int64_t vecs,
                            int64_t splits, int64_t lanes, int64_t flags);
std::vector<int64_t> l2norm_choice(torch::Tensor x);
"""

l2norm = load_inline(
    name="l2norm_v6",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["l2norm_forward", "l2norm_config", "l2norm_choice"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2norm.l2norm_forward(x)
