"""L2 normalisation in CuTe DSL (nvidia-cutlass-dsl, imported as cutlass).

Each row is cut at 16-byte boundaries: the up to 3 (float32) or 7 (16-bit) elements before its
first boundary and after its last are read one by one, everything between as 16-byte vectors
(a vector view of the row whose base offset is declared a multiple of the vector, so CuTe
emits 128-bit loads and stores, ld/st.global.v4). So any width works, odd ones included.

Rows of up to 32768 elements (8192 float32 or 4096 16-bit vectors) are read once: T threads
per row (8 .. 1024 for float32, .. 512 for 16-bit: the smallest power of two that gives each
thread at most 8 vectors; 256 // T rows per CTA where T < 256) keep their slice of the row in
registers, sum its squares in float32, add them up with warp shuffles (past 32 threads also
across warps through shared memory), then scale the slice by the inverse norm (a zero row
stays zero) and store it. Longer rows are split over CTAs of 256 threads x 8 vectors: a first
kernel writes each slice's sum of squares, a second adds its row's sums and scales its slice,
so x is read twice (the second time partly from L2).

Compiled kernels are cached per dtype, vector width (narrower only where a pointer is not
16-byte aligned), threads per row and path; sizes are runtime arguments, so one kernel serves
every shape of its class. Offsets are 64-bit (32768 x 65535 has 2^31 elements)."""
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
import torch.nn as nn
from cutlass import Float32, Int32, Int64
from cutlass.cute.runtime import make_ptr
from cutlass.memory import SmemAllocator  # cutlass.utils.SmemAllocator before 4.8

_VPT = 8          # vectors per thread
# Threads per row on the one-pass path, by element size: 16-bit rows at 1024 threads spill (their
# float32 copies stay live across the reduction; 86 registers at 256 threads, ptxas -v).
_MAX_T = {4: 1024, 2: 512}
_SPLIT_T = 256    # threads per CTA on the split path
_MIN_CTA = 256    # rows per CTA = _MIN_CTA // T where T < _MIN_CTA

_DTYPES = {torch.float32: cutlass.Float32, torch.float16: cutlass.Float16,
           torch.bfloat16: cutlass.BFloat16}


@cute.jit
def _row_parts(x_ptr: cute.Pointer, row: Int32, dim: Int32, vec: cutlass.Constexpr):
    """Where row `row` of a contiguous (rows, dim) tensor starts, how many elements come before
    its first 16-byte boundary (head), how many vectors follow, and the vectors' base offset."""
    start = Int64(row) * Int64(dim)
    head = (vec - start % vec) % vec
    head_n = Int32(cutlass.min(Int64(dim), head))
    nvec = Int32((Int64(dim) - Int64(head_n)) // vec)
    tail_n = dim - head_n - nvec * vec
    voff = cute.assume(start + head, divby=vec)
    return start, head_n, nvec, tail_n, voff


@cute.jit
def _group_sum(val: Float32, tid: Int32, sbuf: cute.Tensor, slot: Int32,
               threads: cutlass.Constexpr) -> Float32:
    """Sum of `val` over a group of `threads` consecutive threads (a power of two; `tid` the
    thread's index in it); every thread of the group gets the total. Past one warp the warps'
    sums meet in sbuf[slot, :], after a barrier that every thread of the CTA must reach."""
    total = cute.arch.warp_reduction(val, lambda a, b: a + b,
                                     threads_in_group=min(threads, 32))
    if cutlass.const_expr(threads > 32):
        warps = threads // 32
        lane = tid % 32
        if lane == 0:
            sbuf[slot, tid // 32] = total
        cute.arch.barrier()
        part = Float32(0.0)
        if lane < warps:
            part = sbuf[slot, lane]
        total = cute.arch.warp_reduction(part, lambda a, b: a + b)  # every lane gets it
    return total


@cute.jit
def _scale_of(ss: Float32) -> Float32:
    inv = Float32(0.0)
    if ss > Float32(0.0):
        inv = Float32(1.0) / cute.math.sqrt(ss)
    return inv


@cute.kernel
def _l2norm_rows(x_ptr: cute.Pointer, y_ptr: cute.Pointer, rows: Int32, dim: Int32,
                 vec: cutlass.Constexpr, threads: cutlass.Constexpr, per_cta: cutlass.Constexpr):
    """One pass: `threads` threads per row, `per_cta` rows per CTA, the row in registers."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    local = tidx // threads
    tid = tidx % threads
    row = bidx * per_cta + local
    sbuf = None
    if cutlass.const_expr(threads > 32):
        sbuf = SmemAllocator().allocate_tensor(
            Float32, cute.make_layout((per_cta, threads // 32)), byte_alignment=16)
    dtype = x_ptr.dtype

    start, head_n, nvec, tail_n, voff = _row_parts(x_ptr, Int32(cutlass.min(row, rows - 1)),
                                                   dim, vec)
    if row >= rows:  # the last CTA's spare rows: no loads or stores, only the barrier
        head_n, nvec, tail_n = Int32(0), Int32(0), Int32(0)
    layout = cute.make_layout((vec, nvec), stride=(1, vec))
    xv = cute.make_tensor(x_ptr + voff, layout)
    yv = cute.make_tensor(y_ptr + voff, layout)
    xs = cute.make_tensor(x_ptr + start, cute.make_layout(dim))
    ys = cute.make_tensor(y_ptr + start, cute.make_layout(dim))

    regs = cute.make_rmem_tensor((vec, _VPT), dtype)  # raw values: half the registers (16-bit)
    regs.fill(0.0)
    for k in cutlass.range_constexpr(_VPT):
        j = tid + k * threads
        if j < nvec:
            regs[None, k].store(xv[None, j].load())
    # Head and tail: fewer than `vec` elements each, one per thread.
    h = Float32(0.0)
    t = Float32(0.0)
    if tid < head_n:
        h = Float32(xs[tid])
    if tid < tail_n:
        t = Float32(xs[dim - tail_n + tid])
    v = regs.load().to(Float32)
    ss = (v * v).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0) + h * h + t * t

    inv = _scale_of(_group_sum(ss, tid, sbuf, local, threads))

    for k in cutlass.range_constexpr(_VPT):
        j = tid + k * threads
        if j < nvec:
            yv[None, j].store((regs[None, k].load().to(Float32) * inv).to(dtype))
    if tid < head_n:
        ys[tid] = (h * inv).to(dtype)
    if tid < tail_n:
        ys[dim - tail_n + tid] = (t * inv).to(dtype)


@cute.kernel
def _l2norm_split(x_ptr: cute.Pointer, y_ptr: cute.Pointer, ws_ptr: cute.Pointer, rows: Int32,
                  dim: Int32, splits: Int32, vec: cutlass.Constexpr, scale: cutlass.Constexpr):
    """Long rows: CTA (row, s) takes vectors [s, s + 1) x 256 x 8 of its row (slice 0 also the
    head and tail). scale=False writes the slice's sum of squares to ws[row, s]; scale=True
    adds ws[row, :] and scales the slice."""
    tidx, _, _ = cute.arch.thread_idx()
    row, split, _ = cute.arch.block_idx()
    threads = _SPLIT_T
    sbuf = SmemAllocator().allocate_tensor(
        Float32, cute.make_layout((1, threads // 32)), byte_alignment=16)
    dtype = x_ptr.dtype
    ws = cute.make_tensor(ws_ptr + Int64(row) * Int64(splits), cute.make_layout(splits))

    start, head_n, nvec, tail_n, voff = _row_parts(x_ptr, row, dim, vec)
    if split > 0:
        head_n, tail_n = Int32(0), Int32(0)
    first = split * (threads * _VPT)
    layout = cute.make_layout((vec, nvec), stride=(1, vec))
    xv = cute.make_tensor(x_ptr + voff, layout)
    yv = cute.make_tensor(y_ptr + voff, layout)
    xs = cute.make_tensor(x_ptr + start, cute.make_layout(dim))
    ys = cute.make_tensor(y_ptr + start, cute.make_layout(dim))

    regs = cute.make_rmem_tensor((vec, _VPT), dtype)  # raw values: half the registers (16-bit)
    regs.fill(0.0)
    for k in cutlass.range_constexpr(_VPT):
        j = first + tidx + k * threads
        if j < nvec:
            regs[None, k].store(xv[None, j].load())
    h = Float32(0.0)
    t = Float32(0.0)
    if tidx < head_n:
        h = Float32(xs[tidx])
    if tidx < tail_n:
        t = Float32(xs[dim - tail_n + tidx])

    if cutlass.const_expr(not scale):
        v = regs.load().to(Float32)
        ss = (v * v).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
        total = _group_sum(ss + h * h + t * t, tidx, sbuf, Int32(0), threads)
        if tidx == 0:
            ws[split] = total
    else:
        part = Float32(0.0)
        for s in cutlass.range(tidx, splits, threads):
            part = part + ws[s]
        inv = _scale_of(_group_sum(part, tidx, sbuf, Int32(0), threads))
        for k in cutlass.range_constexpr(_VPT):
            j = first + tidx + k * threads
            if j < nvec:
                yv[None, j].store((regs[None, k].load().to(Float32) * inv).to(dtype))
        if tidx < head_n:
            ys[tidx] = (h * inv).to(dtype)
        if tidx < tail_n:
            ys[dim - tail_n + tidx] = (t * inv).to(dtype)


@cute.jit
def _launch_rows(x_ptr: cute.Pointer, y_ptr: cute.Pointer, rows: Int32, dim: Int32,
                 stream: cuda.CUstream, vec: cutlass.Constexpr, threads: cutlass.Constexpr):
    per_cta = max(1, _MIN_CTA // threads)
    smem = 0 if threads <= 32 else per_cta * (threads // 32) * 4 + 16
    _l2norm_rows(x_ptr, y_ptr, rows, dim, vec, threads, per_cta).launch(
        grid=[(rows + per_cta - 1) // per_cta, 1, 1], block=[threads * per_cta, 1, 1],
        smem=smem, stream=stream)


@cute.jit
def _launch_split(x_ptr: cute.Pointer, y_ptr: cute.Pointer, ws_ptr: cute.Pointer, rows: Int32,
                  dim: Int32, splits: Int32, stream: cuda.CUstream, vec: cutlass.Constexpr):
    smem = (_SPLIT_T // 32) * 4 + 16
    for scale in cutlass.range_constexpr(2):
        _l2norm_split(x_ptr, y_ptr, ws_ptr, rows, dim, splits, vec, scale == 1).launch(
            grid=[rows, splits, 1], block=[_SPLIT_T, 1, 1], smem=smem, stream=stream)


_compiled: dict[tuple, object] = {}


def _ptr(t: torch.Tensor, dtype, align: int):
    return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    rows, dim = x.shape
    dtype, size = _DTYPES[x.dtype], x.element_size()
    vec = 16 // size
    while vec > 1 and (x.data_ptr() % (vec * size) or y.data_ptr() % (vec * size)):
        vec //= 2
    align = vec * size
    stream = cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    nvec = -(-dim // vec)
    if nvec <= _MAX_T[size] * _VPT:
        threads = 8
        while threads * _VPT < nvec:
            threads *= 2
        key = ("rows", x.dtype, vec, threads)
        args = (_ptr(x, dtype, align), _ptr(y, dtype, align), Int32(rows), Int32(dim), stream)
        if key not in _compiled:
            _compiled[key] = cute.compile(_launch_rows, *args, vec, threads)
        _compiled[key](*args)
        return y
    splits = -(-nvec // (_SPLIT_T * _VPT))
    ws = torch.empty((rows, splits), dtype=torch.float32, device=x.device)
    key = ("split", x.dtype, vec)
    args = (_ptr(x, dtype, align), _ptr(y, dtype, align), _ptr(ws, Float32, 4), Int32(rows),
            Int32(dim), Int32(splits), stream)
    if key not in _compiled:
        _compiled[key] = cute.compile(_launch_split, *args, vec)
    _compiled[key](*args)
    return y


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.numel() == 0:
            return torch.empty_like(x)
        return _l2norm(x)
