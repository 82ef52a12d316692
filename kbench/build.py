"""Building submissions: content-addressed build folders and compiler errors (the toolchain
itself is kbench.toolchain's).

A submission's extensions are built in a folder keyed by the file's hash and everything that
changes the binary (torch, CUDA, target architectures, Python), so an unchanged file is never
recompiled and two submissions that name their extension alike never share a build.
"""

from __future__ import annotations

import hashlib
import platform
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kbench.toolchain import Toolchain


def build_dir(cache_dir: Path, source: Path, toolchain: Toolchain) -> Path:
    """The submission's own TORCH_EXTENSIONS_DIR: name plus a hash of all that shapes the build."""
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for part in (torch.__version__, str(torch.version.cuda), str(toolchain.nvcc_version),
                 str(toolchain.cuda_home), toolchain.arch_list, sys.version, platform.machine(),
                 *toolchain.extra_includes):
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
