"""``kbench doctor``: is this machine able to grade, and if not, what to do about it.

Each check gives one line: ok, warn (grading works, with a caveat) or problem, with the fix in
words. ``kbench grade`` runs the quick checks once at its start; a problem that stops every
CUDA submission from building (no usable nvcc, a compiler that cannot build against torch's
headers) becomes one message at the top of the run and the verdict ``environment_error`` for
the submissions it prevents, instead of a ``build_error`` blamed on each of them. ``kbench
doctor`` adds the slow check: a tiny CUDA extension built with load_inline, and run where a
GPU is visible.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from kbench.host import environment, toolchain
from kbench.host.toolchain import Toolchain, matches, probe
from kbench.results.verdict import first_error_line


class Level(str, Enum):
    OK = "ok"
    WARN = "warn"
    PROBLEM = "problem"


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    detail: str
    fix: str = ""
    # A problem that stops every CUDA submission from building here.
    blocks_cuda: bool = False

    def line(self) -> str:
        fix = f"\n      fix: {self.fix}" if self.fix and self.level is not Level.OK else ""
        return f"{self.level.value:>7}  {self.name}: {self.detail}{fix}"


def _toolkit_fix(tools: Toolchain) -> str:
    wanted = toolchain.torch_cuda()
    if wanted is None:
        return "install a CUDA build of torch (pip serves one by default on Linux)"
    return (f"pip install -e '.[cuda]' (in kbench's checkout) installs NVIDIA's nvcc for CUDA "
            f"{wanted} from PyPI, which kbench finds and prefers; or set CUDA_HOME to a CUDA "
            f"{wanted} toolkit")


def _torch(device: str, tools: Toolchain) -> Check:
    if toolchain.torch_cuda() is None:
        return Check("torch", Level.PROBLEM, f"{torch.__version__}, a CPU-only build: it "
                     "cannot build CUDA extensions", _toolkit_fix(tools), blocks_cuda=True)
    return Check("torch", Level.OK,
                 f"{torch.__version__}, built for CUDA {toolchain.torch_cuda()}")


def _nvcc(device: str, tools: Toolchain) -> Check:
    others = "; also found: " + ", ".join(f"{t.home} ({t.version or 'no answer'}, {t.origin})"
                                          for t in tools.others) if tools.others else ""
    if tools.cuda_home is None:
        level = Level.PROBLEM if device == "cuda" else Level.WARN
        what = ("no nvcc that answers --version found in CUDA_HOME, NVIDIA's wheels, "
                "/usr/local/cuda or on PATH")
        consequence = "" if device == "cuda" else " (CUDA submissions are skipped here)"
        return Check("nvcc", level, what + consequence + others, _toolkit_fix(tools),
                     blocks_cuda=device == "cuda")
    detail = f"{tools.nvcc_version} at {tools.cuda_home} ({tools.origin}){others}"
    wanted = toolchain.torch_cuda()
    if wanted is None or matches(tools.nvcc_version, wanted):
        return Check("nvcc", Level.OK, detail)
    if tools.nvcc_version.split(".")[0] != wanted.split(".")[0]:
        return Check("nvcc", Level.PROBLEM, f"{detail}; torch was built for CUDA {wanted} and "
                     "refuses to build extensions with another major release",
                     _toolkit_fix(tools), blocks_cuda=True)
    return Check("nvcc", Level.WARN, f"{detail}; torch was built for CUDA {wanted} (the compile "
                 "check below says whether that matters here)", _toolkit_fix(tools))


def _host_compiler(device: str, tools: Toolchain) -> Check:
    compiler = shutil.which("c++")
    if compiler is None:
        return Check("host compiler", Level.PROBLEM, "no c++ on PATH (torch compiles the "
                     "C++ side of every extension with it)", "install g++ (Debian: apt-get "
                     "install g++)", blocks_cuda=True)
    return Check("host compiler", Level.OK, f"{compiler}: {_first_line([compiler, '--version'])}")


def _ninja(device: str, tools: Toolchain) -> Check:
    ninja = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    if ninja is None:
        return Check("ninja", Level.PROBLEM, "not found (torch's cpp_extension builds with it)",
                     "pip install ninja", blocks_cuda=True)
    return Check("ninja", Level.OK, f"{ninja} {_first_line([ninja, '--version'])}")


def _gpus(device: str, tools: Toolchain) -> Check:
    """Every visible GPU; free memory only where grading runs (asking opens a CUDA context,
    which costs the GPU's memory in this process)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        level = Level.PROBLEM if device == "cuda" else Level.WARN
        return Check("GPU", level, "no CUDA device visible to torch (CUDA submissions are "
                     "compiled, then skipped)", "run on a machine with an NVIDIA GPU and "
                     "driver, or grade with --device cpu")
    parts, missing = [], []
    targets = tools.arch_list.replace(";", " ").replace("+PTX", "").replace("a", "").split()
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        memory = f"{props.total_memory / 2**30:.1f} GiB"
        if device == "cuda" and index == torch.cuda.current_device():
            free, total = torch.cuda.mem_get_info(index)
            memory = f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free"
        arch = f"{props.major}.{props.minor}"
        parts.append(f"{index}: {props.name}, compute capability {arch}, {memory}")
        if arch not in targets:
            missing.append(arch)
    level, fix = Level.OK, ""
    if missing:
        level, fix = Level.WARN, f"builds target {tools.arch_list}; pass --cuda-arch " \
            f"{';'.join(sorted(set(missing)))}"
    return Check("GPU", level, f"driver {environment.driver_version() or 'unknown'}; "
                 + "; ".join(parts), fix)


def _compile(tools: Toolchain, marks: Path) -> Check:
    if tools.cuda_home is None:
        return Check("CUDA compile", Level.WARN, "not tried: no nvcc")
    error = probe(tools, marks)
    if error is None:
        return Check("CUDA compile", Level.OK, f"nvcc {tools.nvcc_version} builds a kernel "
                     f"against torch's headers for arch {tools.arch_list}")
    mismatch = not matches(tools.nvcc_version, toolchain.torch_cuda())
    fix = _toolkit_fix(tools) if mismatch else "see the error above; compile a kernel by " \
        "hand with the same nvcc to find the cause"
    return Check("CUDA compile", Level.PROBLEM, f"nvcc {tools.nvcc_version} "
                 f"cannot build a kernel against torch {torch.__version__}'s headers: {error}",
                 fix, blocks_cuda=True)


def _first_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(did not answer: {exc})"
    return next((line.strip() for line in (out.stdout + out.stderr).splitlines()
                 if line.strip()), "")


def checks(device: str, tools: Toolchain, cache_dir: Path) -> list[Check]:
    """The quick checks (seconds; the compile check is remembered once it passed)."""
    found: list[Check] = []
    steps: list[Callable[[], Check]] = [
        *(lambda f=f: f(device, tools) for f in (_torch, _nvcc, _host_compiler, _ninja, _gpus)),
        lambda: _compile(tools, cache_dir / "toolkits")]
    names = ["torch", "nvcc", "host compiler", "ninja", "GPU", "CUDA compile"]
    for name, step in zip(names, steps, strict=True):
        try:
            found.append(step())
        except Exception as exc:  # a check that breaks is itself a finding, never a crash
            found.append(Check(name, Level.PROBLEM, f"the check itself failed: {exc!r}"))
    return found


def blocking(found: list[Check]) -> str | None:
    """The message a CUDA submission's environment_error carries, or None."""
    problems = [c for c in found if c.blocks_cuda and c.level is Level.PROBLEM]
    if not problems:
        return None
    first = problems[0]
    detail = first.detail if len(first.detail) <= 300 else first.detail[:297] + "..."
    return (f"not built: this machine cannot build CUDA extensions ({first.name}: {detail}); "
            "the fix is at the top of the report, and `kbench doctor` checks again")


_EXTENSION = '''
import sys, torch
from torch.utils.cpp_extension import load_inline
source = r"""
#include <torch/extension.h>
__global__ void add_one(float* x, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
torch::Tensor add_one_(torch::Tensor x) {
    add_one<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel());
    return x;
}
"""
ext = load_inline(name="kbench_doctor", cpp_sources="torch::Tensor add_one_(torch::Tensor x);",
                  cuda_sources=source, functions=["add_one_"], build_directory=sys.argv[1],
                  verbose=True)
if torch.cuda.is_available():
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    ok = torch.equal(ext.add_one_(x.clone()).cpu(), (x + 1).cpu())
    print("KBENCH_RAN", "right" if ok else "wrong")
'''


def extension(tools: Toolchain, cache_dir: Path) -> Check:
    """Build a tiny load_inline extension (as a submission's build does) and, on a GPU, run
    it. Slow the first time (a minute or more: torch's headers); the build is kept."""
    if tools.cuda_home is None:
        return Check("CUDA extension", Level.WARN, "not tried: no nvcc")
    key = hashlib.sha256("\0".join((str(tools.cuda_home), tools.arch_list, torch.__version__,
                                    _EXTENSION)).encode()).hexdigest()[:16]
    folder = cache_dir / "toolkits" / f"doctor-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kbench-doctor-") as scratch:
        script = Path(scratch) / "extension.py"
        script.write_text(textwrap.dedent(_EXTENSION))
        try:
            run = subprocess.run([sys.executable, str(script), str(folder)], cwd=scratch,
                                 env={**os.environ, **tools.env()},
                                 capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            return Check("CUDA extension", Level.PROBLEM, "the build took over 30 minutes")
    output = run.stdout + run.stderr
    if run.returncode != 0:
        last = output.strip().splitlines()[-1:] or [f"exit status {run.returncode}"]
        return Check("CUDA extension", Level.PROBLEM, "load_inline failed: "
                     + (first_error_line(output) or last[0]), _toolkit_fix(tools),
                     blocks_cuda=True)
    if "KBENCH_RAN wrong" in output:
        return Check("CUDA extension", Level.PROBLEM, "built, but ran with a wrong result",
                     "check the driver and --cuda-arch")
    ran = "built and ran on the GPU" if "KBENCH_RAN right" in output else \
        "built (no GPU here to run it)"
    return Check("CUDA extension", Level.OK, f"a load_inline extension {ran}")
