"""Which precompiled header a C++ compile may use: the compile's own flags, less what names
one file (the source, the object, the dependency file) and the extension's name, hashed with
the compiler. kbench.host.pch builds a header under this key and the compiler wrapper
(kbench.worker.cxx) looks one up under it, so a header is used only by compiles whose flags
are exactly those it was built with. Standard library only: the wrapper imports nothing else."""

from __future__ import annotations

import hashlib
import json

HEADER = "kbench_torch.h"  # what load_inline puts first in main.cpp, and nothing else
HEADER_TEXT = "#include <torch/extension.h>\n"
FIRST_LINE = "#include <torch/extension.h>"  # a source that starts otherwise never gets one
_PER_FILE = {"-c", "-o", "-MF", "-MT", "-MQ"}  # each takes the next argument
_NAME_DEFINE = "-DTORCH_EXTENSION_NAME="  # differs per extension; torch's headers never use it


def compile_flags(argv: list[str]) -> tuple[list[str], str] | None:
    """The flags of a compile of one C++ source (``-c X.cpp``) and that source; None for
    anything else (linking, a version query, several sources, a header)."""
    flags: list[str] = []
    source = None
    it = iter(argv)
    for arg in it:
        if arg in _PER_FILE:
            value = next(it, None)
            if arg == "-c":
                if source is not None or value is None:
                    return None
                source = value
            continue
        if arg in ("-MMD", "-MD") or arg.startswith(_NAME_DEFINE):
            continue
        if arg == "-x" or arg.startswith("-include") or arg.endswith((".cpp", ".cc", ".cxx")):
            return None  # a language override, a forced include or a second source
        flags.append(arg)
    if source is None or not source.endswith((".cpp", ".cc", ".cxx")):
        return None
    return flags, source


def key(compiler: str, flags: list[str]) -> str:
    """The header's folder name for these flags of this compiler."""
    return hashlib.sha256(json.dumps([compiler, flags]).encode()).hexdigest()[:24]
