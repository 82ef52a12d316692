"""The stopwatch: time one callable on fresh inputs, cold cache, until the median is known.

Used the same way for the reference and for candidates (each in its own process), so both
sides of a speedup are measured by one method. Small pieces: ``_ColdCache`` (what happens
before every sample), ``_StoppingRule`` (when enough samples are in), ``kbench.worker.hold``
(one sample on the device's clock) and the two modes in ``measure``:

- eager: one call per sample: the device's time for it, from its first kernel's launch to its
  last one's end, gaps between kernels included; the host's dispatch time is recorded apart;
- graph: a CUDA graph of k calls on k rotating input sets (>= 3x L2 in total) replayed per
  sample, for the kernels' time without per-launch costs.

In both, calls rotate over k input sets and k outputs (>= 3x the cache in total), so a
measurement averages over many buffer addresses rather than the few one process happens to
get, and some outputs are kept (``kbench.worker.kept``) for the trusted side to verify. The
functions the stopwatch relies on are bound when this module is imported, before any
submission is: a submission that patches ``time.perf_counter`` or ``torch.cuda.Event``
does not reach them.
"""

from __future__ import annotations

import ctypes
import functools
import math
import time
from collections.abc import Callable

import torch

from kbench.shared.fingerprint import fingerprint
from kbench.shared.outputs import Unsupported, flatten
from kbench.shared.protocol import Samples
from kbench.shared.stats import converged
from kbench.worker.clocks import Clocks
from kbench.worker.hold import Hold, idle_probe, timed_cuda
from kbench.worker.kept import Inputs, Kept

_now = time.perf_counter
_synchronize = torch.cuda.synchronize

_CPU_FLUSH_BYTES = 64 << 20  # larger than the last-level cache of the CPUs we grade on
_MAX_ROTATION = 512  # input sets in one graph, for shapes far smaller than the L2


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
            _synchronize()


@functools.cache
def clocks_of(device: torch.device) -> Clocks:
    """The device's NVML handle, made once per process (each round used to make its own)."""
    return Clocks(device)


@functools.cache
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
        self.deadline = _now() + budget_ms / 1e3

    def done(self, samples: list[float]) -> bool:
        n = len(samples)
        if n < self.min:
            return False
        if n >= self.max or _now() >= self.deadline:
            return True
        return n % 5 == 0 and converged(samples, self.target)

def rotation(nbytes: int, device: torch.device) -> int:
    """How many input sets (and outputs) calls rotate over: together >= 3x the cache, so a
    set is never in it when its turn comes, and at most _MAX_ROTATION."""
    cache = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" \
        else _CPU_FLUSH_BYTES // 2
    return min(_MAX_ROTATION, max(1, math.ceil(3 * cache / max(1, nbytes))))


def set_bytes(args: list) -> int:
    return sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor))


def measure(call: Callable[[list], object], inputs: Inputs, device: torch.device, *,
            warmup_ms: float, min_samples: int, max_samples: int, budget_ms: float,
            target_ci: float, mode: str = "eager", flush: bool = True
            ) -> tuple[Samples, dict[int, tuple[object, float | None]]]:
    """Time ``call(inputs(i))`` with a fresh input set for every timed call.

    The first call runs untimed (it may JIT or load), then calls repeat for ``warmup_ms``.
    Before every sample the inputs are made and the cache is cooled (see _ColdCache), outside
    the timed interval. A CUDA sample is the interval between events on the current stream,
    queued behind a hold (see kbench.worker.hold) so that it is the device's time, plus
    ``after_ms``, the time the device stayed busy after it (the trusted side charges it when
    it is work on other streams); a CPU sample is wall time. ``mode="graph"`` (CUDA only)
    times graph replays instead and divides by the calls in each. ``flush=False`` skips the
    cache flush (for measuring what it does). See _StoppingRule for when sampling ends.
    Returns the samples and the outputs kept for verification (kbench.worker.kept), by call.
    """
    cuda = device.type == "cuda"
    if mode not in ("eager", "graph") or (mode == "graph" and not cuda):
        raise ValueError(f"timing mode {mode!r}: expected 'eager', or 'graph' on CUDA")
    sync = synchronizer(device)
    cache = _ColdCache(device, flush)
    clocks = clocks_of(device)
    out = Samples(max_sm_mhz=clocks.max_sm_mhz,
                  persisting_l2_reset=cache.reset is not None if cache.cuda and flush else None)

    first = inputs(0)
    dispatch, made = warm_up(call, first, warmup_ms, sync)
    count = rotation(set_bytes(first), device)
    del first
    hold = Hold(device, clocks.max_sm_mhz) if cuda else None
    if hold is not None:
        hold.fit(dispatch[-Hold.WINDOW:])
        out.exclusive_hold = hold.exclusive
        if mode == "eager":
            _prime(made, count, device)
    calls = _GraphCalls(call, inputs, count) if mode == "graph" else \
        _EagerCalls(call, inputs, count)
    out.calls_per_sample = calls.per_sample

    rule = _StoppingRule(min_samples, max_samples, budget_ms, target_ci)
    while not rule.done(out.ms):
        calls.fresh()
        cache.cool()
        if hold is not None:
            timed = timed_cuda(calls.one, hold)
            if timed is None:
                continue
            event_ms, after_ms, host_ms = timed
            # the host waited for the hold, then the call, less its dispatch
            idle_ms = idle_probe(hold.ms + event_ms - host_ms, hold.cycles_per_ms)
        else:
            t0 = _now()
            calls.one()
            event_ms = host_ms = (_now() - t0) * 1e3
            after_ms = idle_ms = 0.0
        calls.returned()
        sm, mem, slowed = clocks.read()
        k = out.calls_per_sample
        out.ms.append(event_ms / k)
        out.after_ms.append(after_ms / k)
        out.idle_ms.append(idle_ms / k)
        out.host_ms.append(host_ms / k)
        out.sm_mhz.append(sm)
        out.mem_mhz.append(mem)
        out.slowed.append(slowed)
    kept = calls.kept()
    out.kept = sorted(kept)
    return out, kept


def synchronizer(device: torch.device) -> Callable[[], None]:
    """The device-wide synchronisation bound at import (a no-op on a CPU)."""
    return _synchronize if device.type == "cuda" else (lambda: None)


def warm_up(call: Callable[[list], object], args: list, warmup_ms: float,
            sync: Callable[[], None]) -> tuple[list[float], list[int]]:
    """A first, untimed call, then calls for ``warmup_ms``; their dispatch times (ms) and the
    sizes in bytes of the tensors one call returns."""
    made = _tensor_bytes(call(args))
    sync()
    dispatch: list[float] = []
    end = _now() + warmup_ms / 1e3
    while _now() < end:
        t0 = _now()
        call(args)
        dispatch.append((_now() - t0) * 1e3)
        sync()
    return dispatch, made


def _tensor_bytes(output: object) -> list[int]:
    try:
        leaves = flatten(output)[0]
    except Unsupported:
        return []
    return [leaf.untyped_storage().nbytes() for leaf in leaves if type(leaf) is torch.Tensor]


def _prime(made: list[int], count: int, device: torch.device) -> None:
    """Blocks for the outputs the rotation keeps (kbench.worker.kept: ``count`` and one more,
    and as many for the input sets made beside them) left in the caching allocator, so that
    a timed call's output does not wait for the driver's allocation while the hold runs: on an
    H200 a call returning 1 MiB took 0.2-0.28 ms to dispatch in the median where its three
    kernels need 0.05, one cudaMalloc every other call, and the holds sized to that doubled
    every sample's device time. Skipped beyond a few times the L2, where the rotation keeps
    one set (large outputs come and go one at a time)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    if not made or count < 2 or 2 * (count + 1) * sum(made) > 16 * l2:
        return
    held = [torch.empty(n, dtype=torch.uint8, device=device) for n in made
            for _ in range(2 * (count + 1))]
    del held


class _EagerCalls:
    """One call per sample on the next of ``count`` rotating input sets, each refilled from
    a new seed when its turn comes; outputs kept as they were returned (kbench.worker.kept)."""

    per_sample = 1

    def __init__(self, call: Callable[[list], object], inputs: Inputs, count: int) -> None:
        self.call, self.inputs, self.count = call, inputs, count
        self.store = Kept(count)
        self.sets: list = [None] * count
        self.indices = iter(range(1, 2**62))
        self.current, self.result = 0, None

    def fresh(self) -> None:
        self.current = next(self.indices)
        slot = self.current % self.count
        self.sets[slot] = None  # freed first: the new set takes its memory
        self.sets[slot] = self.inputs(self.current)
        self.store.make_room()

    def one(self) -> None:
        self.result = self.call(self.sets[self.current % self.count])

    def returned(self) -> None:
        """Outside the interval: the output as it was returned."""
        self.store.add(self.current, self.result, fingerprint(self.result))
        self.result = None

    def kept(self) -> dict[int, tuple[object, float | None]]:
        return self.store.outputs()


class _GraphCalls:
    """A CUDA graph of one call per input set (see _capture), replayed per sample on values
    refilled from new seeds (see _refill)."""

    def __init__(self, call: Callable[[list], object], inputs: Inputs, count: int) -> None:
        sets, self.outputs, graph = _capture(call, inputs, count)
        self.per_sample = len(sets)
        self.indices: list[int] = []
        self.fresh = _refill(sets, inputs, self.indices)
        self.one = graph.replay

    def returned(self) -> None:
        pass

    def kept(self) -> dict[int, tuple[object, float | None]]:
        """The outputs of the last replay, for the inputs of the last refill."""
        return {i: (o, fingerprint(o)) for i, o in zip(self.indices, self.outputs, strict=True)}


def _capture(call: Callable[[list], object], inputs: Inputs, count: int
             ) -> tuple[list[list], list[object], torch.cuda.CUDAGraph]:
    """A graph of one call per input set, ``count`` sets (see rotation), so every replayed
    call reads inputs that are not in the cache; and the graph's outputs."""
    sets = [inputs(1 + j) for j in range(count)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [call(args) for args in sets]
    _synchronize()
    return sets, outputs, graph


def _refill(sets: list[list], inputs: Inputs, indices: list[int]) -> Callable[[], None]:
    """New values into the captured input buffers (a graph replays fixed addresses);
    ``indices`` holds the call index of each set's latest values."""
    counter = iter(range(len(sets) + 1, 2**62))

    def refill() -> None:
        indices.clear()
        for args in sets:
            index = next(counter)
            for dst, src in zip(args, inputs(index), strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            indices.append(index)
    return refill
