"""Verdicts: one per submission, with a one-line reason a user can act on.

Only the trusted side decides a verdict, from what it saw: the process's fate (sandbox
failures) or an error the worker reported (type and message, as text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kbench.shared.protocol import WorkerError

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


class Status(str, Enum):
    OK = "ok"
    BUILD_ERROR = "build_error"
    IMPORT_ERROR = "import_error"
    RUNTIME_ERROR = "runtime_error"
    CUDA_ERROR = "cuda_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OUT_OF_MEMORY = "out_of_memory"
    WRONG_OUTPUT = "wrong_output"
    FLAGGED = "flagged"  # outputs looked right, but a check caught how they were made
    SKIPPED = "skipped"
    # This machine cannot build or run it (a toolchain that cannot compile against torch, say):
    # not the submission's fault, and never reused once the machine is fixed.
    ENVIRONMENT_ERROR = "environment_error"
    # The problem it was graded against cannot be graded (its reference fails, say): said
    # once per problem in the report; not the submission's fault.
    TASK_ERROR = "task_error"
    INTERNAL_ERROR = "internal_error"  # kbench itself failed; not the submission's fault
    # The slot grading it was lost (a cluster node gone, a slot process killed) and retries
    # ran out: never the submission's fault, and graded again by --resume.
    INFRASTRUCTURE_ERROR = "infrastructure_error"


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str = ""


_NO_GPU = ("Found no NVIDIA driver", "No CUDA GPUs are available",
           "Torch not compiled with CUDA enabled", "no CUDA-capable device")
_OOM = ("OutOfMemoryError", "MemoryError", "can't allocate memory", "out of memory")
_CUDA = ("CUDA error", "cudaError", "AcceleratorError", "CUDA kernel errors",
         "illegal memory access", "device-side assert")
# Where TileLang's and CuTe DSL's compilers point in the kernel's source: "--> file:line[:col]".
_SOURCE_AT = re.compile(r"-->\s+(.+?):(\d+)(?::\d+)?\s*$", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours (CuTe DSL's, even into a pipe)


_FATES = {"crashed": Status.CRASHED, "timeout": Status.TIMEOUT,
          "out_of_memory": Status.OUT_OF_MEMORY, "malformed": Status.RUNTIME_ERROR}


def from_fate(fate: str, stage: str, message: str) -> Verdict:
    """A worker that gave no answer (kbench.sandbox.Fate): died, hung, grew too large, or
    sent what kbench does not accept."""
    return Verdict(_FATES[fate], f"{stage}: {message}")


def from_error(error: WorkerError, stage: str, device: str, log: str) -> Verdict:
    """An exception the worker reported during ``stage`` ("import", "init", "case ...", ...)."""
    kind = error.type
    message = _ANSI.sub("", error.message)
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    short = kind.rsplit(".", 1)[-1]
    said = f"{short}: {first}"[:300]
    text = f"{kind} {message}"
    if error.stage == "import" and ("Error building extension" in message
                                           or kind.endswith("CalledProcessError")):
        line = first_error_line(log) or first_error_line(message) or first
        return Verdict(Status.BUILD_ERROR, line[:300])
    if kind.endswith("CompilationError"):  # Triton's: where, the source, then what went wrong
        last = next((line.strip() for line in reversed(message.splitlines()) if line.strip()),
                    first)
        return Verdict(Status.BUILD_ERROR, f"{stage}: Triton: {first} {last}"[:300])
    if device == "cpu" and any(s in text for s in _NO_GPU):
        return Verdict(Status.SKIPPED, f"needs a CUDA device; none here ({said})")
    if any(s in text for s in _OOM):
        return Verdict(Status.OUT_OF_MEMORY, f"{stage}: {said}")
    if any(s in text for s in _CUDA) or short == "DSLCudaRuntimeError":  # CuTe DSL's, launching
        return Verdict(Status.CUDA_ERROR, f"{stage}: {said}")
    if kind.startswith("tvm.error."):  # TileLang's compiler (TVM), not a fault at run time
        return Verdict(Status.BUILD_ERROR, f"{stage}: TileLang: {first}{_source_at(message)}"[:300])
    if kind.startswith("cutlass."):  # CuTe DSL's compiler (tracing, its AST pass, MLIR)
        # Its diagnosis is the line "error: ..." (an internal error heads it with a banner).
        said = next((line.strip().removeprefix("error:").strip() for line in message.splitlines()
                     if line.strip().startswith("error:")), first or short)
        return Verdict(Status.BUILD_ERROR, f"{stage}: CuTe DSL: {said}{_source_at(message)}"[:300])
    if error.stage == "import":
        return Verdict(Status.IMPORT_ERROR, said)
    return Verdict(Status.RUNTIME_ERROR, f"{stage}: {said}")


def _source_at(message: str) -> str:
    where = _SOURCE_AT.search(message)
    return f" (at {Path(where[1]).name}:{where[2]})" if where else ""
