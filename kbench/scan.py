"""Static look at a submission's source: what it needs to run, and labels for the report.

Read as text, never imported. Labels are facts about the code, not verdicts.
"""

from __future__ import annotations

import re

_CUDA_SOURCE = re.compile(r"\bcuda_sources\s*=|__global__|\.cu['\"]")
_CUSTOM_KERNEL = re.compile(r"\bload_inline\b|\bcpp_extension\.load\b|__global__|@triton\.jit")


def needs_cuda(source: str) -> bool:
    """True when the file compiles CUDA code, which no CPU-only machine can run."""
    return bool(_CUSTOM_KERNEL.search(source)) and bool(_CUDA_SOURCE.search(source))


def flags(source: str) -> list[str]:
    """Labels shown beside a result."""
    return [] if _CUSTOM_KERNEL.search(source) else ["no-custom-kernel"]
