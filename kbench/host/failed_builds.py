"""Build failures kept like builds: a compiler's error on the same sources, flags and toolchain
is the same error next time, so a build folder that failed so keeps the verdict, and the next
build of it (a regrade, a test) reads it instead of paying for the same failing nvcc again.

The build folder is keyed by the source and the toolchain (kbench.host.build_dirs); the record
adds what the folder's key leaves out and a compile depends on: the host C++ compiler (its path
and identity), the compiler wrapper kbench may put in front of it, and the flags kbench sets.
Only a compiler's own diagnosis is kept, never what a machine's state could have caused (a
compiler killed, a full disk, memory), nor a timeout, nor a build that was stopped."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from kbench.results.verdict import Status, Verdict

RECORD = "kbench-build-failed.json"
_LOG = "kbench-build-failed.log"  # the failing build's log, for the runs that reuse it
_DIAGNOSIS = re.compile(r"ptxas (?:fatal|error)|nvcc fatal|fatal error|\berror\b\s*(?:[A-Z]+\d+"
                        r"\s*)?:|undefined (?:reference|symbol)", re.IGNORECASE)
_MACHINE = re.compile(r"killed|signal|no space left|cannot allocate|out of memory|"
                      r"resource temporarily|interrupted|terminated", re.IGNORECASE)


def inputs(env: dict[str, str]) -> dict[str, str]:
    """What a compile depends on beyond the build folder's key, from the build's environment."""
    compiler = env.get("CXX") or "c++"
    found = shutil.which(compiler, path=env.get("PATH")) or compiler
    try:
        stat = os.stat(found)
        identity = f"{os.path.realpath(found)}:{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        identity = found
    return {"cxx": identity, "arch": env.get("TORCH_CUDA_ARCH_LIST", ""),
            "cpath": env.get("CPATH", ""), "library_path": env.get("LIBRARY_PATH", "")}


def kept(folder: Path, env: dict[str, str], log: Path) -> Verdict | None:
    """The failure this folder's last build kept, where it was built from the same inputs;
    its compiler output written to ``log`` (this run's build log, which the reports name)."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if record.get("inputs") != inputs(env) or record.get("status") != Status.BUILD_ERROR.value:
        return None
    try:
        output = (folder / _LOG).read_text(errors="replace")
    except OSError:
        output = "(its output was not kept)\n"
    try:
        log.write_text("kbench: this build failed before with the same code, flags and "
                       "toolchain, and is not compiled again; its output then:\n\n" + output)
    except OSError:  # the verdict stands without its log
        pass
    return Verdict(Status.BUILD_ERROR, f"{record.get('reason', '')} (kept from the same "
                   "code's build with this toolchain: not compiled again)")


def keep(folder: Path, env: dict[str, str], verdict: Verdict | None, log: Path) -> None:
    """After a build (its output in ``log``): its failure kept where it is a compiler's
    diagnosis, and an older record dropped where it built (or failed otherwise)."""
    record = folder / RECORD
    if verdict is None or not deterministic(verdict):
        record.unlink(missing_ok=True)
        (folder / _LOG).unlink(missing_ok=True)
        return
    try:
        shutil.copyfile(log, folder / _LOG)
    except OSError:
        (folder / _LOG).unlink(missing_ok=True)
    record.write_text(json.dumps({"status": verdict.status.value, "reason": verdict.reason,
                                  "inputs": inputs(env)}))


def deterministic(verdict: Verdict) -> bool:
    """A build error that names a compiler's diagnosis, and nothing a machine's state causes."""
    return verdict.status is Status.BUILD_ERROR and bool(_DIAGNOSIS.search(verdict.reason)) \
        and not _MACHINE.search(verdict.reason)
