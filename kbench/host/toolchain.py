"""The CUDA toolchain submissions are built with: which toolkit, and whether it can build here.

torch's ``cpp_extension`` compiles with whatever nvcc ``CUDA_HOME`` points at, against torch's
own headers and the CUDA headers that came with torch's wheels. When that nvcc is of another
CUDA release than torch was built with, every CUDA submission fails to build, for a reason
that is the machine's, not the submission's (the most common case: pip served a torch built
for CUDA 13.2 to a machine whose system nvcc is 13.0). So kbench looks at every toolkit it can
find (``CUDA_HOME``, NVIDIA's nvcc wheels installed beside torch by ``pip install
'kbench[cuda]'``, /usr/local/cuda, nvcc on PATH), prefers one whose release matches torch's,
and ``probe`` compiles a few lines against torch's headers the way submissions are compiled,
so a toolchain that cannot work is reported once, before any submission is blamed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from kbench.results.verdict import first_error_line

# Where a system-wide toolkit lives when CUDA_HOME does not say.
SYSTEM_HOMES = ("/usr/local/cuda",)

# Used when no GPU is visible and TORCH_CUDA_ARCH_LIST is unset: the Hopper GPUs kbench is
# calibrated on. Builds still prove that a kernel compiles; they just cannot run here.
DEFAULT_CUDA_ARCH = "9.0"


@dataclass(frozen=True)
class Toolkit:
    """One CUDA toolkit found on this machine."""

    home: str
    version: str | None  # nvcc's release, e.g. "13.0"; None where nvcc does not answer
    origin: str  # how it was found: "CUDA_HOME", "NVIDIA's nvcc wheel", "/usr/local/cuda", "PATH"


@dataclass(frozen=True)
class Toolchain:
    cuda_home: str | None
    nvcc_version: str | None
    arch_list: str
    extra_includes: tuple[str, ...] = ()
    origin: str | None = None  # see Toolkit.origin
    # Folders holding link names (libcudart.so) that a wheel toolkit ships only versioned.
    library_dirs: tuple[str, ...] = ()
    others: tuple[Toolkit, ...] = field(default=(), compare=False)  # found, not chosen

    def env(self) -> dict[str, str]:
        """Variables a build process needs so torch's cpp_extension finds and targets them."""
        env = {"TORCH_CUDA_ARCH_LIST": self.arch_list}
        if self.cuda_home:
            env["CUDA_HOME"] = self.cuda_home
            env["PATH"] = os.pathsep.join(p for p in (str(Path(self.cuda_home) / "bin"),
                                                      os.environ.get("PATH")) if p)
        for name, extra in (("CPATH", self.extra_includes), ("LIBRARY_PATH", self.library_dirs)):
            if extra:
                env[name] = os.pathsep.join(p for p in (os.environ.get(name), *extra) if p)
        return env


def torch_cuda() -> str | None:
    """The CUDA release torch was built with ("13.0"), None for a CPU-only build."""
    return torch.version.cuda


def matches(version: str | None, wanted: str | None) -> bool:
    """Same major and minor release."""
    return bool(version and wanted) and version.split(".")[:2] == wanted.split(".")[:2]


@cache
def find_toolchain(arch: str | None = None, links_dir: Path | None = None) -> Toolchain:
    """The toolkit to build with: the first found (CUDA_HOME, NVIDIA's wheels, /usr/local/cuda,
    PATH) whose release matches torch's; else the first of torch's major release; else the
    first that answers. ``links_dir`` is where link names a wheel toolkit lacks are made."""
    found = _toolkits()
    wanted = torch_cuda()
    ranked = ([t for t in found if matches(t.version, wanted)]
              + [t for t in found if t.version and wanted
                 and t.version.split(".")[0] == wanted.split(".")[0]]
              + [t for t in found if t.version])
    arch_list = arch or _arch_list()
    if not ranked:
        return Toolchain(None, None, arch_list, others=tuple(found))
    best = ranked[0]
    return Toolchain(best.home, best.version, arch_list, _missing_headers(best.home),
                     origin=best.origin,
                     library_dirs=_link_names(best.home, best.version, links_dir),
                     others=tuple(t for t in found if t != best))


def _toolkits() -> list[Toolkit]:
    homes: list[tuple[str, str]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            homes.append((os.environ[var], var))
    homes += [(str(nvcc.parent.parent), "NVIDIA's nvcc wheel") for nvcc in _wheel_nvccs()]
    homes += [(home, home) for home in SYSTEM_HOMES]
    if nvcc := shutil.which("nvcc"):
        homes.append((str(Path(nvcc).resolve().parent.parent), "PATH"))
    seen, found = set(), []
    for home, origin in homes:
        key = os.path.realpath(home)
        if key in seen or not (Path(home) / "bin" / "nvcc").exists():
            continue
        seen.add(key)
        found.append(Toolkit(home, _nvcc_version(home), origin))
    return found


def _wheel_nvccs() -> list[Path]:
    """nvcc from NVIDIA's PyPI wheels in this environment (nvidia/cu13/bin/nvcc for CUDA 13,
    nvidia/cuda_nvcc/bin/nvcc for CUDA 12)."""
    return sorted(nvcc for root in _wheel_roots() for nvcc in root.glob("*/bin/nvcc"))


def _missing_headers(cuda_home: str) -> tuple[str, ...]:
    """Header folders of the CUDA wheels installed with torch, when the toolkit lacks the math
    libraries' headers (a compiler-only install): ATen/cuda/CUDAContext.h needs cusparse.h."""
    if (Path(cuda_home) / "include" / "cusparse.h").exists():
        return ()
    return tuple(sorted(str(d) for root in _wheel_roots() for d in root.glob("*/include")
                        if (d / "cusparse.h").exists()))


def _link_names(cuda_home: str, version: str | None, links_dir: Path | None
                ) -> tuple[str, ...]:
    """NVIDIA's wheels ship libcudart.so.13 but not the libcudart.so that torch's link line
    (-lcudart) asks for: make that name in a folder of kbench's own, for LIBRARY_PATH."""
    home = Path(cuda_home)
    if any((home / lib / "libcudart.so").exists() for lib in ("lib64", "lib")):
        return ()
    major = (version or "").split(".")[0]
    pattern = f"libcudart.so.{major}*"  # the runtime of the toolkit's own release
    versioned = sorted((home / "lib").glob(pattern)) + \
        sorted(p for root in _wheel_roots() for p in root.glob(f"*/lib/{pattern}"))
    if not versioned or links_dir is None:
        return ()
    folder = links_dir / hashlib.sha256(str(versioned[0]).encode()).hexdigest()[:16]
    link = folder / "libcudart.so"
    if not link.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".libcudart.so.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(versioned[0])
        os.replace(tmp, link)
    return (str(folder),)


def _wheel_roots() -> list[Path]:
    """The folders of the ``nvidia`` namespace package NVIDIA's wheels install into."""
    try:
        import nvidia
    except ImportError:
        return []
    return [Path(root) for root in nvidia.__path__]


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


# A few lines that reach what every load_inline CUDA build reaches: the CUDA runtime and
# half-precision headers, and torch's headers that pull in CUDA's C++ library (CCCL), whose
# own check fails when nvcc and the CUDA headers are of different releases.
_PROBE = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <c10/util/complex.h>
#include <c10/util/Half.h>
__global__ void kbench_probe(float* x) { x[threadIdx.x] += 1.0f; }
"""


def probe(tools: Toolchain, marks: Path | None = None) -> str | None:
    """Compile ``_PROBE`` with this toolchain as torch's cpp_extension compiles a submission's
    CUDA source (its include folders and flags, the same environment): None if it builds,
    else the compiler's first error line. A success is remembered in ``marks`` (keyed on
    everything that shapes the compile), so it costs seconds once per machine and toolchain."""
    if tools.cuda_home is None:
        return "no CUDA toolkit found"
    # Importing it logs which CUDA_HOME this process would use: not the one probed here.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    arch = tools.arch_list.replace(";", " ").split()[0].split("+")[0].replace(".", "")
    std = "-std=c++20" if "-std=c++20" in Path(cpp_extension.__file__).read_text() \
        else "-std=c++17"
    # torch's own folders, then the toolkit's, in cpp_extension's order (its "cuda" list
    # names the CUDA_HOME this process found, which need not be the chosen one); like it,
    # never /usr/include, which breaks the C++ library's #include_next
    includes = [*cpp_extension.include_paths("cpu"), str(Path(tools.cuda_home) / "include")]
    includes = [i for i in includes if i != "/usr/include"]
    command = [str(Path(tools.cuda_home) / "bin" / "nvcc"), std, "-c", "-o", "probe.o",
               f"-gencode=arch=compute_{arch},code=sm_{arch}",
               *cpp_extension.COMMON_NVCC_FLAGS, *(f for i in includes for f in ("-isystem", i)),
               "probe.cu"]
    env = {**os.environ, **tools.env()}
    key = hashlib.sha256("\0".join([*command, _PROBE, torch.__version__, str(tools.nvcc_version),
                                    os.path.realpath(command[0]),
                                    *(env.get(k, "") for k in ("CPATH", "PATH"))]).encode())
    mark = marks / f"probe-{key.hexdigest()[:16]}.ok" if marks else None
    if mark is not None and mark.exists():
        return None
    with tempfile.TemporaryDirectory(prefix="kbench-probe-") as folder:
        (Path(folder) / "probe.cu").write_text(_PROBE)
        try:
            run = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                                 timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"nvcc could not run: {exc}"
    if run.returncode != 0:
        output = run.stdout + run.stderr
        lines = output.strip().splitlines()
        return first_error_line(output) or (lines[-1] if lines
                                            else f"nvcc exited with {run.returncode}")
    if mark is not None:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    return None
