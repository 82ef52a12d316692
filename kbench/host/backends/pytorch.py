"""Plain PyTorch, and C++ built with ``load_inline`` for the CPU: nothing beyond torch and a
host compiler, which every torch install that builds extensions has."""

from __future__ import annotations

from kbench.host.backends.base import Backend


class PyTorch(Backend):
    name = "pytorch"

    def claims(self, source: str) -> bool:
        return True
