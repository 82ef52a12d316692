"""GPU clocks from NVML, read between timed calls: was this sample taken at full speed?

kbench only reads clocks; it never sets them. NVML is reached through ctypes (the driver ships
libnvidia-ml.so.1), so no Python package is needed; where it cannot be loaded every reading is
None and reports say that clocks were not recorded.
"""

from __future__ import annotations

import ctypes

import torch

_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t
# nvmlClocksEventReasons bits that mean the GPU is running slower than it could: software power
# cap, hardware slowdown, software and hardware thermal slowdown, power brake. Idle, application
# clock settings and sync boost are not slowdowns of a busy GPU.
_SLOWDOWN = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


class Clocks:
    """One CUDA device's NVML handle; ``read()`` gives (SM MHz, memory MHz, slowed down)."""

    def __init__(self, device: torch.device) -> None:
        self._lib = None
        self._handle = ctypes.c_void_p()
        self.max_sm_mhz: int | None = None
        if device.type != "cuda":
            return
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", uuid]
            if not any(lib.nvmlDeviceGetHandleByUUID(n.encode(), ctypes.byref(self._handle)) == 0
                       for n in names):
                return
            self._reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                lib.nvmlDeviceGetCurrentClocksThrottleReasons
        except (OSError, AttributeError, RuntimeError):
            return
        self._lib = lib
        self.max_sm_mhz = self._clock(lib.nvmlDeviceGetMaxClockInfo, _CLOCK_SM)

    def _clock(self, query, kind: int) -> int | None:
        value = ctypes.c_uint()
        return value.value if query(self._handle, kind, ctypes.byref(value)) == 0 else None

    def read(self) -> tuple[int | None, int | None, bool]:
        if self._lib is None:
            return None, None, False
        sm = self._clock(self._lib.nvmlDeviceGetClockInfo, _CLOCK_SM)
        mem = self._clock(self._lib.nvmlDeviceGetClockInfo, _CLOCK_MEM)
        reasons = ctypes.c_ulonglong()
        slowed = self._reasons(self._handle, ctypes.byref(reasons)) == 0 and bool(
            reasons.value & _SLOWDOWN)
        return sm, mem, slowed
