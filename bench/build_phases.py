"""Where a cold CUDA build's time goes: build each submission from nothing (its own empty
extensions folder, kbench's toolchain environment) and print, per compiled file, the seconds
ninja measured, and for the .cu file nvcc's own phases (`nvcc --time`, through
NVCC_APPEND_FLAGS).

    python bench/build_phases.py kbench/submissions/l2norm_v3.py kbench/submissions/l2norm_v8.py

Builds run one after another, each with ``--jobs`` ninja jobs (default 2: the .cpp and the .cu
side by side, as kbench builds them when it has the cores). Loading the built extension needs
a GPU; on a machine without one the build still completes and is measured.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def build(path: Path, jobs: int, folder: Path
          ) -> tuple[float, str, dict[str, float], dict[str, float]]:
    """Wall seconds of importing ``path`` (its load_inline build), the end of its error output
    where it failed for another reason than the missing GPU, ninja's seconds per output (of
    each extension) and nvcc's seconds per phase (summed over the .cu files)."""
    from kbench.host.toolchain import find_toolchain

    phases = folder / "nvcc-time.csv"
    env = {**os.environ, **find_toolchain().env(), "TORCH_EXTENSIONS_DIR": str(folder / "ext"),
           "MAX_JOBS": str(jobs), "NVCC_APPEND_FLAGS": f"--time {phases}"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(path)!r})"],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    failed = "Error building extension" in done.stderr
    error = "\n".join(done.stderr.strip().splitlines()[-5:]) if failed else ""
    steps: dict[str, float] = {}
    for log in (folder / "ext").glob("*/.ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            begin, end, _, output, _ = line.split("\t")
            steps[f"{log.parent.name}/{output}"] = (int(end) - int(begin)) / 1000
    nvcc: dict[str, float] = defaultdict(float)
    if phases.exists():
        for row in csv.reader(phases.read_text().splitlines()[1:]):
            if len(row) >= 8 and row[7].strip() == "ms":
                nvcc[row[1].strip()] += float(row[6]) / 1000
    return wall, error, steps, dict(nvcc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="CUDA load_inline submissions")
    parser.add_argument("--jobs", type=int, default=2, help="ninja jobs per build (MAX_JOBS)")
    args = parser.parse_args()
    for path in args.paths:
        with tempfile.TemporaryDirectory() as tmp:
            wall, error, steps, nvcc = build(path.resolve(), args.jobs, Path(tmp))
        if error:
            print(f"{path}: the build failed (partial timings below):\n{error}")
        if not steps:
            print(f"{path}: nothing was compiled (not a load_inline submission, or it failed "
                  "before its build)")
            continue
        print(f"{path.name}: {wall:.1f} s wall, MAX_JOBS={args.jobs}")
        for output, seconds in sorted(steps.items(), key=lambda kv: -kv[1]):
            print(f"  {output:<36} {seconds:6.1f} s")
        for phase, seconds in sorted(nvcc.items(), key=lambda kv: -kv[1]):
            print(f"    nvcc {phase:<22} {seconds:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
