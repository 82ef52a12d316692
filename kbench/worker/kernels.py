"""The kernels a call runs, read from torch's profiler in the submission's process; the
trusted side sorts them into the submission's own and torch's libraries'
(kbench.grading.checking.custom_kernels). A submission can reach what runs here, so the figures are
evidence for a policy, not proof (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from kbench.shared.protocol import KernelRun

_profile, _synchronize = profile, torch.cuda.synchronize  # bound before a submission imports
_ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def prepare_profiler() -> None:
    """The profiler started and stopped with nothing to record: what its first start costs
    (seconds, on the host) is paid here, ahead of the profiled calls."""
    with _profile(activities=_ACTIVITIES):
        pass


def kernels_of(model: Callable[..., object], args: list) -> list[KernelRun]:
    """One call of ``model`` on ``args`` under the profiler, after one outside it (so what a
    first call does, autotuning or a cache filled, is not counted): the device time of each
    kernel, memcpy and memset it ran, summed per name and the innermost profiler op it was
    launched in. The profiler links a kernel to the op open at its launch (torch's
    operators, aten::..., open one each); one launched from an extension's or a JIT
    language's own launcher is linked to none. Ranges a user or torch.compile annotated on
    the device's timeline are not kernels and are left out."""
    model(*args)
    _synchronize()
    with _profile(activities=_ACTIVITIES) as prof:
        output = model(*args)
        _synchronize()
    del output, args
    events = prof.events()
    linked: dict[str, list[str]] = {}  # kernel name -> the ops it was linked to
    for event in events:
        if event.device_type == DeviceType.CPU:
            for kernel in event.kernels:
                linked.setdefault(kernel.name, []).append(event.name)
    summed: dict[tuple[str, str], float] = {}
    for event in events:
        if event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation",
                                                                 False):
            ops = linked.get(event.name)
            key = (str(event.name), str(ops.pop(0)) if ops else "")
            summed[key] = summed.get(key, 0.0) + float(event.time_range.elapsed_us())
    return [KernelRun(name, us, op) for (name, op), us in summed.items()]
