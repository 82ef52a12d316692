"""Kernel languages behind one small interface: which submissions a backend claims, the
tools it needs, how its builds are set up, and why one cannot build or run here.

The grader asks ``for_source`` and never branches on a language itself. A backend that
claims nothing special (plain PyTorch, C++ through ``load_inline``) comes last.
"""

from __future__ import annotations

from kbench.host.backends.base import Backend
from kbench.host.backends.cuda_inline import CudaInline
from kbench.host.backends.python_dsl import CUTE_DSL, TILELANG, TRITON
from kbench.host.backends.pytorch import PyTorch

# CUDA first: a file that also compiles CUDA C++ needs nvcc whatever else it uses.
BACKENDS: tuple[Backend, ...] = (CudaInline(), TRITON, CUTE_DSL, TILELANG, PyTorch())


def for_source(source: str) -> Backend:
    """The first backend that claims this submission's source."""
    return next(b for b in BACKENDS if b.claims(source))


__all__ = ["BACKENDS", "Backend", "for_source"]
