"""Building submissions: the CUDA toolchain, content-addressed build folders, compiler errors.

A submission's extensions are built in a folder keyed by the file's hash and everything that
changes the binary (torch, CUDA, target architectures, Python), so an unchanged file is never
recompiled and two submissions that name their extension alike never share a build.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

# Used when no GPU is visible and TORCH_CUDA_ARCH_LIST is unset: the Hopper GPUs kbench is
# calibrated on. Builds still prove that a kernel compiles; they just cannot run here.
DEFAULT_CUDA_ARCH = "9.0"


@dataclass(frozen=True)
class Toolchain:
    cuda_home: str | None
    nvcc_version: str | None
    arch_list: str
    extra_includes: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        """Variables a build process needs so torch's cpp_extension finds and targets them."""
        env = {"TORCH_CUDA_ARCH_LIST": self.arch_list}
        if self.cuda_home:
            env["CUDA_HOME"] = self.cuda_home
        if self.extra_includes:
            env["CPATH"] = os.pathsep.join(
                p for p in (os.environ.get("CPATH"), *self.extra_includes) if p)
        return env


@cache
def find_toolchain(arch: str | None = None) -> Toolchain:
    """The CUDA toolkit as torch finds it, but preferring /usr/local/cuda over a stray nvcc on
    PATH when CUDA_HOME is unset; the arch list from the argument, the environment, or the GPU."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not cuda_home and Path("/usr/local/cuda/bin/nvcc").exists():
        cuda_home = "/usr/local/cuda"
    if not cuda_home and (nvcc := shutil.which("nvcc")):
        cuda_home = str(Path(nvcc).resolve().parent.parent)
    nvcc_version = _nvcc_version(cuda_home) if cuda_home else None
    if nvcc_version is None:
        return Toolchain(None, None, arch or _arch_list())
    return Toolchain(cuda_home, nvcc_version, arch or _arch_list(), _missing_headers(cuda_home))


def _missing_headers(cuda_home: str) -> tuple[str, ...]:
    """Header folders of the CUDA wheels installed with torch, when the toolkit lacks the math
    libraries' headers (a compiler-only install): ATen/cuda/CUDAContext.h needs cusparse.h."""
    if (Path(cuda_home) / "include" / "cusparse.h").exists():
        return ()
    try:
        import nvidia  # the namespace package of NVIDIA's wheels that torch depends on
    except ImportError:
        return ()
    return tuple(sorted(str(d) for root in nvidia.__path__ for d in Path(root).glob("*/include")
                        if (d / "cusparse.h").exists()))


def _arch_list() -> str:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return DEFAULT_CUDA_ARCH


def _nvcc_version(cuda_home: str) -> str | None:
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release ([\d.]+)", out)
    return match.group(1) if match else None


def build_dir(cache_dir: Path, source: Path, toolchain: Toolchain) -> Path:
    """The submission's own TORCH_EXTENSIONS_DIR: name plus a hash of all that shapes the build."""
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for part in (torch.__version__, str(torch.version.cuda), str(toolchain.nvcc_version),
                 toolchain.arch_list, sys.version, platform.machine(), *toolchain.extra_includes):
        digest.update(b"\0" + part.encode())
    return cache_dir / "extensions" / f"{source.stem}-{digest.hexdigest()[:16]}"


_COMPILER_ERROR = re.compile(
    r"ptxas (?:fatal|error)|nvcc fatal|fatal error|\berror\b\s*(?:[A-Z]+\d+\s*)?:|"
    r"undefined (?:reference|symbol)|collect2:",
    re.IGNORECASE)


def first_error_line(log: str) -> str | None:
    """The first line of a build log that reports a real compiler or linker error, else torch's
    own "Error building extension" line."""
    lines = log.splitlines()
    for line in lines:
        if _COMPILER_ERROR.search(line) and "Error building extension" not in line:
            return re.sub(r"^(?:[^\s:]*/)+", "", line.strip())  # build folders are noise
    return next((line.strip() for line in lines if "Error building extension" in line), None)
