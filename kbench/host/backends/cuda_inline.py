"""CUDA C++ built with ``torch.utils.cpp_extension.load_inline``: needs nvcc (a toolkit that
compiles against this torch, kbench.host.toolchain) and, to run, a CUDA device."""

from __future__ import annotations

import ast

from kbench.host import source_scan
from kbench.host.backends.base import Backend
from kbench.host.toolchain import Toolchain
from kbench.results.verdict import Status, Verdict


class CudaInline(Backend):
    name = "cuda"

    def claims(self, source: str) -> bool:
        return source_scan.needs_cuda(source)

    def unavailable(self, toolchain: Toolchain, environment_problem: str | None,
                    source: str = "") -> Verdict | None:
        if environment_problem:  # the machine's fault, said once per run (kbench.host.doctor)
            return Verdict(Status.ENVIRONMENT_ERROR, environment_problem)
        if not toolchain.cuda_home:
            return Verdict(Status.SKIPPED, "compiles CUDA code and no CUDA toolkit was found "
                           "here (kbench doctor says how to get one)")
        return None

    def cannot_run(self, device: str, toolchain: Toolchain) -> Verdict | None:
        if device != "cpu":
            return None
        return Verdict(Status.SKIPPED, f"built with nvcc {toolchain.nvcc_version} for CUDA arch "
                       f"{toolchain.arch_list}; needs a CUDA device to run")

    def unbuilt(self, device: str, toolchain: Toolchain, source: str) -> Verdict | None:
        """On a machine without a CUDA device: skipped without nvcc's minutes (its Python
        syntax checked: a parse runs nothing)."""
        if device != "cpu":
            return None
        try:
            ast.parse(source)
        except SyntaxError as exc:
            return Verdict(Status.IMPORT_ERROR, f"line {exc.lineno}: SyntaxError: {exc.msg}")
        return Verdict(Status.SKIPPED, "CUDA C++ needs a CUDA device to run, and this machine "
                       "has none: not compiled here (its Python syntax is fine; `kbench grade "
                       "--build-all` compiles it, to find its build errors)")
