"""Building submissions: content-addressed build folders (the toolchain itself is
kbench.host.toolchain's; the first compiler error of a log, kbench.results.verdict's).

A submission's extensions are built in a folder keyed by the file's hash and everything that
changes the binary (torch, CUDA, target architectures, Python), so an unchanged file is never
recompiled and two submissions that name their extension alike never share a build.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kbench.host.toolchain import Toolchain


def build_dir(cache_dir: Path, source: Path, toolchain: Toolchain) -> Path:
    """The submission's own TORCH_EXTENSIONS_DIR: name plus a hash of all that shapes the build."""
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for part in (torch.__version__, str(torch.version.cuda), str(toolchain.nvcc_version),
                 str(toolchain.cuda_home), toolchain.arch_list, sys.version, platform.machine(),
                 *toolchain.extra_includes):
        digest.update(b"\0" + part.encode())
    return cache_dir / "extensions" / f"{source.stem}-{digest.hexdigest()[:16]}"
