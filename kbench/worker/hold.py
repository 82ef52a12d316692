"""One CUDA sample on the device's clock: a hold kernel ahead of the call, events around it,
and how long the device stayed busy after it (work left on other streams).

The functions relied on are bound at import, before any submission is imported.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections import deque
from collections.abc import Callable

import torch

from kbench.shared.protocol import HOLD_MAX_MS

_now = time.perf_counter
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_elapsed = torch._C._CudaEventBase.elapsed_time  # a C method: submissions cannot replace it
_record = torch._C._CudaEventBase.record
_wait = torch._C._CudaEventBase.synchronize
_spin = torch.cuda._sleep
_current_stream = torch.cuda.current_stream


class Hold:
    """A kernel queued ahead of each timed call, long enough that the host has queued the
    whole call before the start event runs: the interval is then the device's time for the
    call (its kernels and the gaps between them), not the host's Python dispatch, which varies
    from process to process by tens of microseconds. The host's dispatch time is measured
    separately. A sample whose dispatch outran the hold is discarded and the next one held
    twice that long; otherwise the hold follows the latest dispatch times (see fit).

    The hold fills every SM (``_spin_all_sms``): a kernel the call launches on a stream that
    does not wait for the caller's cannot run during the hold and finish before the start
    event, unseen; it runs inside the interval or after it, where the device-busy check
    sees it. Where that kernel cannot be loaded, a one-thread spin (``torch.cuda._sleep``)
    stands in, and ``exclusive`` is False."""

    MAX_MS = HOLD_MAX_MS
    WINDOW = 20  # latest dispatch times the hold is sized from

    def __init__(self, device: torch.device, sm_mhz: int | None) -> None:
        self.cycles_per_ms = _cycles_per_ms(sm_mhz)
        self.ms = 0.05
        self.recent: deque[float] = deque(maxlen=self.WINDOW)
        self.spin_all = _spin_all_sms(device)
        self.exclusive = self.spin_all is not None

    def fit(self, dispatch_ms: list[float]) -> None:
        """Size the hold from dispatch times (ms), warm-up calls' first: twice the 90th
        percentile of the latest WINDOW, so that one slow dispatch (a page fault, the
        host's scheduler) does not set it for a whole round. Sized by the longest and never
        shortened again, the hold and the idle probe that matches it took 2.2 ms of every
        launch-bound sample on an H100 (four times the rest of the sample), and on an H200
        half of a timed l2norm submission's device time went to holds and probes."""
        self.recent.extend(dispatch_ms)
        ordered = sorted(self.recent)
        high = ordered[int(0.9 * (len(ordered) - 1))] if ordered else 0.0
        self.ms = min(self.MAX_MS, max(0.05, 2 * high))

    def __call__(self) -> None:
        if self.spin_all is not None:
            self.spin_all(int(self.ms * 1e6))
        else:
            _spin(int(self.ms * self.cycles_per_ms))

    def covered(self, dispatch_ms: float) -> bool:
        """Did the hold outlast queueing (with a margin for the events)? If not, the next
        hold is twice this dispatch; either way the one after follows the latest dispatch
        times again (fit). At MAX_MS every sample counts and the hold stays: a call that
        waits on the device while it is queued is timed as it is."""
        if self.ms >= self.MAX_MS:
            return True
        if dispatch_ms < 0.8 * self.ms:
            self.fit([dispatch_ms])
            return True
        self.recent.append(dispatch_ms)
        self.ms = min(self.MAX_MS, 2 * dispatch_ms)
        return False


# Spins until %globaltimer (ns) passes its start plus the argument. PTX, so the driver compiles
# it for whatever GPU this is, with no compiler needed here.
_SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry kbench_spin(.param .u64 kbench_spin_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [kbench_spin_ns];
    mov.u64 %rd2, %globaltimer;
    add.s64 %rd3, %rd2, %rd1;
$Lspin:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p1, %rd4, %rd3;
    @%p1 bra $Lspin;
    ret;
}
"""


def _spin_all_sms(device: torch.device) -> Callable[[int], None] | None:
    """A launcher of ``kbench_spin`` with as many threads as every SM can hold (so no other
    kernel fits beside it until it ends) on the current stream, for ``ns`` nanoseconds; None
    where the driver API or the PTX is unavailable. Made once per device and stream in a
    process: the driver compiles the PTX as it loads it."""
    if device.type != "cuda":
        return None
    return _launcher(device, _current_stream(device).cuda_stream)


@functools.cache
def _launcher(device: torch.device, stream_handle: int) -> Callable[[int], None] | None:
    """See _spin_all_sms."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        _synchronize(device)  # the runtime's primary context is current on this thread
        module, func = ctypes.c_void_p(), ctypes.c_void_p()
        if cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(_SPIN_PTX)) != 0 or \
                cuda.cuModuleGetFunction(ctypes.byref(func), module, b"kbench_spin") != 0:
            return None
        launch = cuda.cuLaunchKernel
    except (OSError, AttributeError, RuntimeError):
        return None
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    props = torch.cuda.get_device_properties(device)
    threads = props.max_threads_per_multi_processor
    block = min(1024, threads // 2)
    grid = props.multi_processor_count * (threads // block)
    ns = ctypes.c_uint64()
    params = (ctypes.c_void_p * 1)(ctypes.addressof(ns))

    def spin(nanoseconds: int) -> None:
        ns.value = nanoseconds
        if launch(func, grid, 1, 1, block, 1, 1, 0, stream_handle, params, None) != 0:
            raise RuntimeError("kbench's hold kernel failed to launch")
    return spin


def timed_cuda(fn: Callable[[], object],
                hold: Hold) -> tuple[float, float, float] | None:
    """(ms between events around ``fn`` on the current stream, ms from the end event until
    the whole device was idle (see _busy_after), ms the host took to queue ``fn``); None when
    queueing outlasted the hold (the interval would include host time; the hold is
    lengthened for the next try). The device must be idle on entry."""
    start, end = _Event(enable_timing=True), _Event(enable_timing=True)
    stream = _current_stream()
    _synchronize()
    hold()
    _record(start, stream)
    t0 = _now()
    fn()
    dispatch_ms = (_now() - t0) * 1e3
    _record(end, stream)
    after_ms = _busy_after(end, stream)
    return (_elapsed(start, end), after_ms, dispatch_ms) if hold.covered(dispatch_ms) else None


def _busy_after(end: torch.cuda.Event, stream: torch.cuda.Stream) -> float:
    """Device ms from ``end`` (recorded last on ``stream``) to an event recorded there once a
    device-wide synchronisation has returned: work left on other streams counts in full
    however late the host wakes, and so does the host's wake-up time (see idle_probe)."""
    idle = _Event(enable_timing=True)
    _wait(end)
    _synchronize()
    _record(idle, stream)
    _wait(idle)
    return _elapsed(end, idle)


def _cycles_per_ms(sm_mhz: int | None) -> int:
    """Spin cycles a millisecond at the device's top SM clock (2 GHz where NVML gives none)."""
    return (sm_mhz or 2000) * 1000


def idle_probe(wait_ms: float, cycles_per_ms: float) -> float:
    """``_busy_after`` for a spin of ``wait_ms`` (50 us to 2 ms) that keeps only the current
    stream busy: the host's wake-up time alone, for the trusted side to subtract. It is
    measured right after each sample, for a wait as long as the sample's, because it moves:
    on one H100 it grew from 13 to 80 us as the wait grew from 50 us to 5 ms, and to 140 us
    while the allocator was still mapping new memory."""
    end, stream = _Event(enable_timing=True), _current_stream()
    _synchronize()
    _spin(int(min(2.0, max(0.05, wait_ms)) * cycles_per_ms))
    _record(end, stream)
    return _busy_after(end, stream)


class DeviceWait:
    """A call's stand-in in an empty clocked pass on a GPU (kbench.worker.kept.clocked): the
    device spun ``ms`` (the call's figure), between two events. The host then waits on the
    device after each "call" as it does after a real one, and on a busy host its thread is
    woken as late: on an H200 beside 32 busy processes an honest call's clocked pass ran 0.889
    ms a call against 0.567 explained while the empty pass, with nothing to wait for, stayed
    short. The trusted side takes the spins' own device time (``waited_ms``) out again."""

    def __init__(self, ms: float, sm_mhz: int | None) -> None:
        self.cycles = int(ms * _cycles_per_ms(sm_mhz))
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        _spin(1)  # the spin's module loaded now, not between the first wait's events

    def __call__(self, args: list) -> None:
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        stream = _current_stream()
        _record(start, stream)
        _spin(self.cycles)
        _record(end, stream)
        self.events.append((start, end))

    def waited_ms(self) -> float:
        """The spins' device time in all (every spin done: the pass synchronised after each)."""
        return sum(_elapsed(start, end) for start, end in self.events)
