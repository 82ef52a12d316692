"""The stopwatch: time one callable on fresh inputs, cold cache, until the median is known.

Used the same way for the reference and for candidates (each in its own process), so both
sides of a speedup are measured by one method. Small pieces: ``_ColdCache`` (what happens
before every sample), ``_StoppingRule`` (when enough samples are in), ``_Hold`` and
``_timed_cuda`` (one sample on the device's clock) and the two modes in ``measure``:

- eager: one call per sample: the device's time for it, from its first kernel's launch to its
  last one's end, gaps between kernels included; the host's dispatch time is recorded apart;
- graph: a CUDA graph of k calls on k rotating input sets (>= 3x L2 in total) replayed per
  sample, for the kernels' time without per-launch costs.
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from kbench.stats import converged
from kbench.worker.clocks import Clocks

Inputs = Callable[[int], list]  # call index -> a fresh input set, values never seen before

_CPU_FLUSH_BYTES = 64 << 20  # larger than the last-level cache of the CPUs we grade on
_MAX_ROTATION = 512  # input sets in one graph, for shapes far smaller than the L2


@dataclass
class Samples:
    """What ``measure`` returns: per-call times in ms and what the device was doing."""

    ms: list[float] = field(default_factory=list)  # per call: events (CUDA) or wall clock (CPU)
    # CUDA: per call, how much longer a device-wide synchronisation took after the end event
    # than on an idle device: work left on other streams, or host jitter (the trusted side
    # tells them apart over all samples); 0 on a CPU.
    after_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)  # host time to issue the call (CUDA)
    after_idle_ms: float = 0.0  # median after_ms of an empty call: this process's offset
    sm_mhz: list[int | None] = field(default_factory=list)  # read right after each sample
    mem_mhz: list[int | None] = field(default_factory=list)
    slowed: list[bool] = field(default_factory=list)  # NVML reported a slowdown reason
    max_sm_mhz: int | None = None
    calls_per_sample: int = 1
    persisting_l2_reset: bool | None = None  # CUDA: could the runtime's reset be called

    def to_dict(self) -> dict:
        return asdict(self)


class _ColdCache:
    """Before each sample: flush the caches (a write of >= 2x the L2 on CUDA), reset the
    persisting-L2 lines a call may have set aside, and wait until the device is idle."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.cuda = device.type == "cuda"
        size = 2 * torch.cuda.get_device_properties(device).L2_cache_size if self.cuda \
            else _CPU_FLUSH_BYTES
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device) if enabled else None
        self.reset = _persisting_l2_reset() if self.cuda and enabled else None

    def cool(self) -> None:
        if self.buffer is not None:
            self.buffer.zero_()
        if self.reset is not None:
            self.reset()
        if self.cuda:
            torch.cuda.synchronize()


def _persisting_l2_reset() -> Callable[[], int] | None:
    """cudaCtxResetPersistingL2Cache from the CUDA runtime this process has loaded."""
    names = [f"libcudart.so.{(torch.version.cuda or '').split('.')[0]}"]
    try:
        with open("/proc/self/maps") as maps:
            names += sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
    except OSError:
        pass
    for name in names:
        try:
            return ctypes.CDLL(name).cudaCtxResetPersistingL2Cache
        except (OSError, AttributeError):
            continue
    return None


class _StoppingRule:
    """At least ``min_samples``; then stop at ``max_samples``, when ``budget_ms`` of wall time
    has passed, or once the median's 95 % interval is within ``target_ci`` (relative
    half-width), checked every 5th sample because it sorts."""

    def __init__(self, min_samples: int, max_samples: int, budget_ms: float,
                 target_ci: float) -> None:
        self.min, self.max, self.target = min_samples, max_samples, target_ci
        self.deadline = time.perf_counter() + budget_ms / 1e3

    def done(self, samples: list[float]) -> bool:
        n = len(samples)
        if n < self.min:
            return False
        if n >= self.max or time.perf_counter() >= self.deadline:
            return True
        return n % 5 == 0 and converged(samples, self.target)


class _Hold:
    """A spin kernel queued ahead of each timed call, long enough that the host has queued
    the whole call before the start event runs: the interval is then the device's time for
    the call (its kernels and the gaps between them), not the host's Python dispatch, which
    varies from process to process by tens of microseconds. The host's dispatch time is
    measured separately. The hold doubles whenever a call took longer to queue than it."""

    MAX_MS = 50.0  # a call that takes longer to queue (it waits on the device) is timed as is

    def __init__(self, sm_mhz: int | None) -> None:
        self.cycles_per_ms = (sm_mhz or 2000) * 1000
        self.ms = 0.05

    def fit(self, dispatch_ms: list[float]) -> None:
        """Size the hold from warm-up calls' dispatch times (ms)."""
        self.ms = min(self.MAX_MS, max(0.05, 2 * max(dispatch_ms, default=0.0)))

    def __call__(self) -> None:
        torch.cuda._sleep(int(self.ms * self.cycles_per_ms))

    def covered(self, dispatch_ms: float) -> bool:
        """Did the hold outlast queueing (with a margin for the events)? If not, lengthen it."""
        if dispatch_ms < 0.8 * self.ms or self.ms >= self.MAX_MS:
            return True
        self.ms = min(self.MAX_MS, 2 * dispatch_ms)
        return False


def _timed_cuda(fn: Callable[[], object],
                hold: _Hold) -> tuple[float, float, float] | None:
    """(ms between events around ``fn`` on the current stream, ms the device stayed busy after
    the end event, ms the host took to queue ``fn``); None when queueing outlasted the hold
    (the interval would include host time; the hold is lengthened for the next try). The
    device must be idle on entry. The second figure is measured on the host, as the wait for
    a device-wide synchronisation beyond what one costs on an idle device: work ``fn`` left
    on other streams, plus a per-process offset (see Samples.after_idle_ms) and jitter."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    torch.cuda.synchronize()
    idle = time.perf_counter() - t0
    hold()
    start.record()
    t0 = time.perf_counter()
    fn()
    dispatch_ms = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    after_ms = (time.perf_counter() - t1 - idle) * 1e3
    return (start.elapsed_time(end), after_ms, dispatch_ms) if hold.covered(dispatch_ms) else None


def measure(call: Callable[[list], object], inputs: Inputs, device: torch.device, *,
            warmup_ms: float, min_samples: int, max_samples: int, budget_ms: float,
            target_ci: float, mode: str = "eager", flush: bool = True) -> Samples:
    """Time ``call(inputs(i))`` with a fresh input set for every timed call.

    The first call runs untimed (it may JIT or load), then calls repeat for ``warmup_ms``.
    Before every sample the inputs are made and the cache is cooled (see _ColdCache), outside
    the timed interval. A CUDA sample is the interval between events on the current stream,
    queued behind a hold (see _Hold) so that it is the device's time, plus ``after_ms``, the
    time the device stayed busy after it (the trusted side charges it when it is work on
    other streams); a CPU sample is wall time. ``mode="graph"`` (CUDA only)
    times graph replays instead and divides by the calls in each. ``flush=False`` skips the
    cache flush (for measuring what it does). See _StoppingRule for when sampling ends.
    """
    cuda = device.type == "cuda"
    if mode not in ("eager", "graph") or (mode == "graph" and not cuda):
        raise ValueError(f"timing mode {mode!r}: expected 'eager', or 'graph' on CUDA")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cache = _ColdCache(device, flush)
    clocks = Clocks(device)
    out = Samples(max_sm_mhz=clocks.max_sm_mhz,
                  persisting_l2_reset=cache.reset is not None if cache.cuda and flush else None)

    first = inputs(0)
    call(first)
    sync()
    dispatch: list[float] = []
    warmup_end = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < warmup_end:
        t0 = time.perf_counter()
        call(first)
        dispatch.append((time.perf_counter() - t0) * 1e3)
        sync()
    del first
    hold = _Hold(clocks.max_sm_mhz)
    hold.fit(dispatch[-20:])
    if cuda:
        out.after_idle_ms = _idle_after_ms(cache, hold)

    if mode == "graph":
        sets, graph = _capture(call, inputs, device)
        out.calls_per_sample = len(sets)
        fresh = _refill(sets, inputs)
        one = graph.replay
    else:
        args: list = []

        def fresh() -> None:
            nonlocal args
            args = []  # the previous set is freed before the next is made
            args = inputs(len(out.ms) + 1)

        def one() -> None:
            call(args)

    rule = _StoppingRule(min_samples, max_samples, budget_ms, target_ci)
    while not rule.done(out.ms):
        fresh()
        cache.cool()
        if cuda:
            timed = _timed_cuda(one, hold)
            if timed is None:
                continue
            event_ms, after_ms, host_ms = timed
        else:
            t0 = time.perf_counter()
            one()
            event_ms = host_ms = (time.perf_counter() - t0) * 1e3
            after_ms = 0.0
        sm, mem, slowed = clocks.read()
        k = out.calls_per_sample
        out.ms.append(event_ms / k)
        out.after_ms.append(after_ms / k)
        out.host_ms.append(host_ms / k)
        out.sm_mhz.append(sm)
        out.mem_mhz.append(mem)
        out.slowed.append(slowed)
    return out


def _idle_after_ms(cache: _ColdCache, hold: _Hold, calls: int = 21) -> float:
    """The after_ms an empty call gets in this process: what a synchronisation after an
    event costs here, against which work left on other streams is measured."""
    afters = []
    while len(afters) < calls:
        cache.cool()
        timed = _timed_cuda(lambda: None, hold)
        if timed is not None:
            afters.append(timed[1])
    return statistics.median(afters)


def _capture(call: Callable[[list], object], inputs: Inputs,
             device: torch.device) -> tuple[list[list], torch.cuda.CUDAGraph]:
    """A graph of one call per input set, with enough sets that together they are >= 3x the
    L2, so every replayed call reads inputs that are not in the cache."""
    probe = inputs(1)
    nbytes = sum(t.numel() * t.element_size() for t in probe if isinstance(t, torch.Tensor))
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    count = min(_MAX_ROTATION, max(1, math.ceil(3 * l2 / max(1, nbytes))))
    sets = [probe] + [inputs(2 + j) for j in range(count - 1)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in sets:
            call(args)
    torch.cuda.synchronize()
    return sets, graph


def _refill(sets: list[list], inputs: Inputs) -> Callable[[], None]:
    """New values into the captured input buffers (a graph replays fixed addresses)."""
    counter = iter(range(len(sets) + 1, 2**62))

    def refill() -> None:
        for args in sets:
            for dst, src in zip(args, inputs(next(counter)), strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
    return refill
