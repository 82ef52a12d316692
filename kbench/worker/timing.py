"""The stopwatch: time one callable, one call at a time, cold cache, until enough samples.

Used the same way for the reference and for candidates (each in its own process), so both
sides of a speedup are measured by one method.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kbench.stats import converged

_CPU_FLUSH_BYTES = 64 << 20  # larger than the last-level cache of the CPUs we grade on


def measure(call: Callable[[], object], device: torch.device, *, warmup_ms: float,
            min_samples: int, max_samples: int, budget_ms: float,
            target_ci: float) -> list[float]:
    """Milliseconds per call of ``call``.

    The first call runs untimed (it may JIT or load), then calls repeat for ``warmup_ms``. Each
    timed call starts after the device is idle and the cache has been flushed (a write of twice
    the L2 on CUDA); CUDA calls are timed with events and followed by a device-wide sync, so
    work left on other streams is waited for before the next call. Sampling stops once
    ``min_samples`` are in and the median's 95 % interval is within ``target_ci`` of it
    (relative half-width), or ``budget_ms`` of wall time has passed, or at ``max_samples``.
    """
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    flush = torch.empty(_flush_bytes(device), dtype=torch.uint8, device=device)

    call()
    sync()
    warmup_end = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < warmup_end:
        call()
        sync()

    samples: list[float] = []
    budget_end = time.perf_counter() + budget_ms / 1e3
    while len(samples) < min_samples or not _done(samples, max_samples, budget_end, target_ci):
        flush.zero_()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def _done(samples: list[float], max_samples: int, budget_end: float, target_ci: float) -> bool:
    if len(samples) >= max_samples or time.perf_counter() >= budget_end:
        return True
    return len(samples) % 5 == 0 and converged(samples, target_ci)  # every 5th: sorting costs


def _flush_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).L2_cache_size
    return _CPU_FLUSH_BYTES
