"""What a result was measured on: recorded with every run, shown in every report."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import torch

from kbench import __version__
from kbench.host.toolchain import Toolchain


def describe(device: str, toolchain: Toolchain) -> dict:
    env = {
        "kbench_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nvcc": toolchain.nvcc_version,
        "cuda_arch_list": toolchain.arch_list,
        "device": device,
        "device_name": _cpu_model(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update({
            "device_name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "l2_cache_mib": round(props.L2_cache_size / 2**20, 1),
            "driver": driver_version(),
        })
    return env


_SOFTWARE_KEYS = ("device", "device_name", "python", "torch", "torch_cuda", "nvcc",
                  "cuda_arch_list", "driver")


def fingerprint(env: dict) -> str:
    """What must match for an earlier result to stand for a new one: device and software."""
    return json.dumps({k: env.get(k) for k in _SOFTWARE_KEYS}, sort_keys=True)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None
