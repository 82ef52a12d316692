"""A build folder's loadable outputs as bytes that travel (kbench.grading.running.cluster): built
on one node, checked and unpacked into the grading node's own build folder, never a shared one.

What travels is the libraries the build's ``load_inline`` calls produced, with the manifest
that maps each call to its library (kbench.shared.manifest), as a tar, its sha256, and the key
of what shapes a binary: the submission's bytes, torch, its CUDA and C++ ABI, nvcc, the target
architectures, Python and the machine. The grading node unpacks it only where its own key is
the same and the bytes hash to the sum sent, under the folder's build lock; anything else is
built there instead. A build whose folder holds a library no call recorded (an extension
built some other way) is not shipped at all: the grading node could not load it faithfully."""

from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from kbench.host import build_lock
from kbench.host.toolchain import Toolchain
from kbench.shared import manifest

SHIPPED = ".kbench-shipped"  # written by ``install``: this folder's libraries came from a node
_LIBRARIES = (".so", ".pyd", ".dll")


@dataclass(frozen=True)
class Artifact:
    key: dict[str, str]
    sha256: str  # of ``data``
    data: bytes  # a tar: the manifest and the libraries it names

    @property
    def size(self) -> int:
        return len(self.data)


def key(toolchain: Toolchain, source_sha256: str) -> dict[str, str]:
    """What must be the same where a build is loaded as where it was made."""
    return {"source": source_sha256, "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "nvcc": str(toolchain.nvcc_version),
            "arch": toolchain.arch_list, "cxx11_abi": str(torch._C._GLIBCXX_USE_CXX11_ABI),
            "python": sys.version.split()[0], "machine": platform.machine()}


def pack(folder: Path, build_key: dict[str, str]) -> Artifact | None:
    """The folder's recorded libraries; None where nothing was recorded (nothing to load:
    the grading node imports the file as it is) or a library was built unrecorded."""
    calls = manifest.read(folder / manifest.MANIFEST)
    files = {_inside(folder, entry) for entry in calls.values()}
    if not calls or None in files or unrecorded(folder):
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in [manifest.MANIFEST, *sorted(files)]:
            tar.add(folder / name, arcname=name, recursive=False)
    data = buffer.getvalue()
    return Artifact(build_key, hashlib.sha256(data).hexdigest(), data)


def _inside(folder: Path, entry: object) -> str | None:
    """A manifest entry's library, where it names a regular file inside ``folder``: the
    manifest is written in the submission's process, and the trusted side reads only what
    lies in the build folder."""
    name = entry.get("file") if isinstance(entry, dict) else None
    if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
        return None
    path = folder / name
    return name if path.is_file() and not path.is_symlink() else None


def install(artifact: Artifact, folder: Path, build_key: dict[str, str], wait_s: float
            ) -> str:
    """Unpack ``artifact`` into ``folder`` (this node's own build folder for the file) under
    its build lock; "" once done, else why not (then the file is built here). Each file
    replaces the one there (a new inode, never rewritten in place: another worker of this
    node may have the old library loaded)."""
    differs = sorted(k for k in set(artifact.key) | set(build_key)
                     if artifact.key.get(k) != build_key.get(k))
    if differs:
        return "built for another " + ", ".join(
            f"{k} ({artifact.key.get(k)} there, {build_key.get(k)} here)" for k in differs)
    if hashlib.sha256(artifact.data).hexdigest() != artifact.sha256:
        return "its bytes do not match the sum sent with them"
    try:
        with build_lock.held(folder, wait_s), \
                tarfile.open(fileobj=io.BytesIO(artifact.data)) as tar:
            members = tar.getmembers()
            if any(not m.isfile() or Path(m.name).is_absolute() or ".." in Path(m.name).parts
                   for m in members):
                return "it holds something other than files inside its folder"
            with tempfile.TemporaryDirectory(dir=folder, prefix=".unpack-") as tmp:
                for member in members:
                    target = folder / member.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    staged = Path(tmp) / hashlib.sha256(member.name.encode()).hexdigest()
                    with tar.extractfile(member) as src, open(staged, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    staged.chmod(member.mode & 0o777)
                    os.replace(staged, target)
            (folder / SHIPPED).write_text(artifact.sha256)
    except (build_lock.Busy, OSError, tarfile.TarError) as exc:
        return f"not unpacked ({type(exc).__name__}: {exc})"
    return ""


def unrecorded(folder: Path) -> list[str]:
    """The libraries in ``folder`` that no recorded load_inline call produced."""
    files = {_inside(folder, e) for e in manifest.read(folder / manifest.MANIFEST).values()}
    return sorted(name for p in folder.rglob("*") if p.suffix in _LIBRARIES
                  if (name := str(p.relative_to(folder))) not in files)


def shipped(folder: Path) -> bool:
    """Were this folder's libraries unpacked from another node's build (``install``)?"""
    return (folder / SHIPPED).is_file()
