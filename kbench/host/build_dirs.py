"""Building submissions: content-addressed build folders (the toolchain itself is
kbench.host.toolchain's; the first compiler error of a log, kbench.results.verdict's).

A submission's extensions are built in a folder keyed by its code and everything that changes
the binary (torch, CUDA, target architectures, Python), so an unchanged file is never
recompiled. Files with the same code (the same syntax tree: comments, docstrings and layout
aside) share one folder, so their extensions are built once (each still loads in its own
processes): the same code makes the same ``load_inline`` calls. Not where the code reads what
differs between two files or two runs (its own path, the environment, the clock, randomness, a
file, names looked up at run time): such a file keeps a folder of its own, keyed by its bytes
and path.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kbench.host.toolchain import Toolchain

# Names through which two files of the same code could pass different inputs to load_inline.
_DIFFERS = frozenset({
    "__file__", "__doc__", "__name__", "__spec__", "__loader__", "__path__", "__cached__",
    "__builtins__", "__import__", "__dict__", "inspect", "importlib", "sys", "environ", "getenv",
    "argv",
    "random", "uuid", "secrets", "time", "datetime", "getpid", "globals", "locals", "vars",
    "eval", "exec", "compile", "getattr", "open", "Path", "tempfile", "socket", "pathlib",
    "os", "subprocess", "ctypes"})


def share_key(source: Path) -> bytes:
    """What identifies the file's build: its syntax tree where same code means same build,
    else its path and bytes."""
    text = source.read_bytes()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return str(source.resolve()).encode() + b"\0" + text
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {part for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names for part in (a.name.split(".") + [getattr(n, "module", "")])}
    if names & _DIFFERS:
        return str(source.resolve()).encode() + b"\0" + text
    for node in ast.walk(tree):  # docstrings: nothing reads them (no __doc__ above)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
    return b"ast\0" + ast.dump(tree).encode()


def build_dir(cache_dir: Path, source: Path, toolchain: Toolchain) -> Path:
    """The submission's own TORCH_EXTENSIONS_DIR (shared with files of the same code): a hash
    of all that shapes the build."""
    digest = hashlib.sha256()
    digest.update(share_key(source))
    for part in (torch.__version__, str(torch.version.cuda), str(toolchain.nvcc_version),
                 str(toolchain.cuda_home), toolchain.arch_list, sys.version, platform.machine(),
                 *toolchain.extra_includes):
        digest.update(b"\0" + part.encode())
    return cache_dir / "extensions" / f"build-{digest.hexdigest()[:16]}"


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)
