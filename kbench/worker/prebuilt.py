"""Extensions built on another machine (a Ray build node, kbench.grading.running.cluster): a build
records which library each ``load_inline`` call produced, and a grading machine that was sent
those libraries loads them for the same calls instead of compiling. torch's own check cannot
be reused across machines: ninja's records hold the build folder's absolute paths, which
differ from node to node, so it would compile everything again.

``KBENCH_PREBUILT=record``: after each call, its key (every argument but ``verbose`` and
``build_directory``) and the library's file and sha256 go into MANIFEST in
``TORCH_EXTENSIONS_DIR``. ``replay``: a call whose key is there and whose file still has that
hash loads the file; any other call compiles here, as it would without kbench (GPU MODE's
kernelbot does the same with the built libraries it ships to its GPU runners)."""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

from kbench.shared.manifest import MANIFEST, call_key, file_hash, read

_IGNORED = ("verbose", "build_directory")


def install() -> None:
    """Wrap torch's load_inline as ``KBENCH_PREBUILT`` asks (nothing when it is unset)."""
    mode = os.environ.get("KBENCH_PREBUILT")
    folder = os.environ.get("TORCH_EXTENSIONS_DIR")
    if mode not in ("record", "replay") or not folder:
        return
    from torch.utils import cpp_extension

    real = cpp_extension.load_inline
    signature = inspect.signature(real)
    manifest = Path(folder) / MANIFEST

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = call_key({k: v for k, v in bound.arguments.items() if k not in _IGNORED})
        if mode == "replay":
            loaded = _replay(cpp_extension, manifest, key, bound.arguments["is_python_module"])
            if loaded is not None:
                return loaded
            print(f"kbench: load_inline({bound.arguments['name']!r}) was not in the build "
                  "shipped here: compiling it on this machine", file=sys.stderr)
        result = real(*args, **kwargs)
        if mode == "record":
            _record(manifest, key, result)
        return result

    cpp_extension.load_inline = load_inline


def _record(manifest: Path, key: str, result: Any) -> None:
    file = getattr(result, "__file__", result)
    if not isinstance(file, str):
        return
    path = Path(file).resolve()
    root = manifest.parent.resolve()
    if root not in path.parents or not path.is_file():  # built elsewhere: not shipped
        return
    calls = read(manifest)
    calls[key] = {"file": str(path.relative_to(root)), "sha256": file_hash(path)}
    temporary = manifest.with_name(f"{MANIFEST}.{os.getpid()}")
    temporary.write_text(json.dumps({"calls": calls}, indent=1))
    os.replace(temporary, manifest)


def _replay(cpp_extension: Any, manifest: Path, key: str, python_module: bool) -> Any:
    entry = read(manifest).get(key)
    if not entry:
        return None
    path = (manifest.parent / entry["file"]).resolve()
    if manifest.parent.resolve() not in path.parents or not path.is_file() or \
            file_hash(path) != entry["sha256"]:
        return None
    return cpp_extension._import_module_from_library(path.stem, str(path.parent), python_module)
