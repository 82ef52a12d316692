"""Kernel languages embedded in Python that compile at a kernel's first launch: Triton, CuTe DSL
(``nvidia-cutlass-dsl``, imported as ``cutlass``) and TileLang. Each is recognised by its import
in the source (never by importing the file), needs its package and a CUDA device, and keeps its
compile cache in the submission's own build folder, so no two submissions share one."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from kbench.host import source_scan
from kbench.host.backends.base import Backend
from kbench.host.toolchain import Toolchain
from kbench.results.verdict import Status, Verdict


class PythonDsl(Backend):
    jit = True

    def __init__(self, name: str, label: str, module: str, extra: str,
                 cache_vars: tuple[str, ...]) -> None:
        self.name, self.label, self.module, self.extra = name, label, module, extra
        self.cache_vars = cache_vars  # what points its compile cache into the build folder

    def claims(self, source: str) -> bool:
        return self.module in source_scan.imported(source)

    def unavailable(self, toolchain: Toolchain, environment_problem: str | None,
                    source: str = "") -> Verdict | None:
        if importlib.util.find_spec(self.module) is not None:
            return None  # the build imports it: syntax, imports and kernel definitions checked
        try:
            ast.parse(source)
        except SyntaxError as exc:
            return Verdict(Status.IMPORT_ERROR, f"line {exc.lineno}: SyntaxError: {exc.msg}")
        return Verdict(Status.SKIPPED, f"written in {self.label}, which is not installed here "
                       f"(pip install -e '.[{self.extra}]'); its Python syntax is fine")

    def cannot_run(self, device: str, toolchain: Toolchain) -> Verdict | None:
        if device != "cpu":
            return None
        return Verdict(Status.SKIPPED, f"{self.label} kernels need a CUDA device to run; the "
                       "file imported cleanly here")

    def env(self, toolchain: Toolchain, folder: Path, cores: int) -> dict[str, str]:
        cache = str(folder / f"{self.name}-cache")
        return {**super().env(toolchain, folder, cores), **dict.fromkeys(self.cache_vars, cache)}


TRITON = PythonDsl("triton", "Triton", "triton", "triton", ("TRITON_CACHE_DIR",))
# Their cache variables are not pinned down here: HOME and XDG_CACHE_HOME, pointed into the
# build folder, catch any cache kept under the user's home.
CUTE_DSL = PythonDsl("cute_dsl", "CuTe DSL", "cutlass", "cute", ("HOME", "XDG_CACHE_HOME"))
TILELANG = PythonDsl("tilelang", "TileLang", "tilelang", "tilelang", ("HOME", "XDG_CACHE_HOME"))
