"""Grade the timing-sensitive submissions at idle and with every core busy, side by side.

A verdict must not depend on how loaded the host is: an honest kernel graded while the other
GPUs' slots build (dozens of nvcc processes) must not look like it hides work, and a cheat
must not win because the host was busy. This grades PATH... ``--runs`` times at idle and as
often with ``--busy`` processes of compiler-like work running (alternately, same seed per
pair), and prints each submission's verdicts and speedups under both, with any verdict that
moved and any cheat that ranked above its honest twin.

    # CPU: the cheat fixtures and their honest twin (a task timed at 2048x4096 is written)
    python bench/under_load.py --runs 3
    # CPU: the bundled quick start five times beside two busy loops; copies of three bundled
    # references, whose speedups' intervals must hold 1.0 (or read "not measurable here")
    python bench/under_load.py kbench/submissions/ --runs 5 --busy 2 --phases load --honest
    python bench/under_load.py bench/submissions/same_as_reference/ --runs 5 --busy 2 \
        --phases load --honest --same
    # a GPU host: the bundled CUDA kernels, nvcc loops on every core
    python bench/under_load.py kbench/submissions/l2norm_v[3-8].py \\
        --device cuda --kind nvcc --busy 48 -- --profile quick

Arguments after ``--`` go to ``kbench grade``. Exit status 1 when a verdict moved or a
cheat ranked above its twin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CPU_DEFAULT = [FIXTURES / "cpu_timing" / "l2norm_tampers_stopwatch.py",
               *(FIXTURES / "cpu" / f"l2norm_{n}.py" for n in (
                   "torch_ok", "patches_timer", "slows_reference", "stops_reference"))]
# Tricks that stay correct, and the honest submission doing the same math: never faster.
TWINS = {n: "l2norm_torch_ok" for n in ("l2norm_patches_timer", "l2norm_slows_reference",
                                        "l2norm_stops_reference")}

# Compiler-like work: a C file of many functions compiled again and again (what a build
# pipeline puts on every core), or a busy loop where no compiler is found.
_C_SOURCE = "\n".join(f"double f{i}(double *x, int n) {{ double s = 0; for (int j = 0; j < n; "
                      f"j++) s += x[j] * {i}.5 / (j + 1); return s; }}" for i in range(400))
_CU_SOURCE = _C_SOURCE.replace("double f", "__device__ double f") + \
    "\n__global__ void k(double *x) { x[0] = f1(x, 8); }\n"


@contextlib.contextmanager
def busy(count: int, kind: str = "spin", nice: int = 0) -> Iterator[list[subprocess.Popen]]:
    """``count`` processes of busy work for the block: ``spin`` (a Python busy loop), ``cc``
    (the host's C compiler in a loop) or ``nvcc`` (CUDA compiles in a loop), at ``nice``.
    Each loop leads a process group of its own, killed whole with the compiler it runs; they
    stay in this process's session, so kbench never takes them for a worker's strays."""
    folder = Path(tempfile.mkdtemp(prefix="kbench-load-"))
    command = _command(kind, folder)

    def setup() -> None:
        os.setpgid(0, 0)
        os.nice(nice)

    procs = [subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, preexec_fn=setup)
             for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _command(kind: str, folder: Path) -> list[str]:
    if kind == "spin":
        return [sys.executable, "-c", "while True: pass"]
    compiler = {"cc": shutil.which("cc") or shutil.which("gcc"), "nvcc": shutil.which("nvcc")}
    if kind not in compiler:
        raise SystemExit(f"--kind {kind}: spin, cc or nvcc")
    if compiler[kind] is None:
        raise SystemExit(f"--kind {kind}: no {kind} on PATH")
    source = folder / ("load.cu" if kind == "nvcc" else "load.c")
    source.write_text(_CU_SOURCE if kind == "nvcc" else _C_SOURCE)
    # Each loop writes its own object file: several compilers at once never share one.
    return ["sh", "-c", f'while :; do "{compiler[kind]}" -O2 -c {source.name} -o "o.$$"; '
            'done']


def cpu_task(folder: Path, shape: tuple[int, int] = (2048, 4096)) -> Path:
    """tasks/l2norm.yaml cut down for CPU fixtures, timed at ``shape`` (2048x4096: 32 MiB a
    tensor, some 10 ms a call, where a stopwatch forged to a third is far outside kbench's own
    clock's slack)."""
    raw = yaml.safe_load((ROOT / "tasks" / "l2norm.yaml").read_text())
    raw["correctness"].update(random_cases=3, max_elements=65536,
                              fixed_shapes=[[1, 1], [7, 33], [16, 1024]])
    raw["benchmarks"]["cpu"] = [list(shape)]
    raw["timing"].update(min_samples=3, max_samples=50, budget_ms=20, warmup_ms=5,
                         target_ci=0.01, compile_reference=False)
    raw["limits"].update(load_s=120, case_s=60, benchmark_s=120, host_memory_gib=3)
    path = folder / "task" / "l2norm.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def grade(paths: list[str], args: argparse.Namespace, out: Path, cache: Path, seed: int,
          task: Path | None) -> dict[str, dict]:
    """One ``kbench grade`` in a process of its own: submission name -> its result."""
    command = [sys.executable, "-m", "kbench", "grade", *paths, "--device", args.device,
               "--seed", str(seed), "--out", str(out), "--cache-dir", str(cache),
               *(["--task", str(task)] if task else []), *args.kbench]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    results = json.loads((out / "results.json").read_text())
    if args.keep:  # each run's results, for the evidence: PHASE-RUN.json
        args.keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "results.json", args.keep / f"{args.phase_run}.json")
    shutil.rmtree(out)
    return {s["name"]: s for s in results["submissions"]}


def _figures(sub: dict) -> str:
    """A result's speedup with its interval, or why it has none, and its timing's seconds
    (the budget a disturbed host's timing is held to), for the per-run lines."""
    timing = (sub.get("stage_s") or {}).get("timing")
    took = f" (timed in {timing:.0f} s)" if timing is not None else ""
    if sub["speedup"]:
        low, high = sub["speedup_ci"] or (sub["speedup"], sub["speedup"])
        return f"{sub['speedup']:.3f}x [{low:.3f}-{high:.3f}]{took}"
    return f"({sub['reason'][:160]}){took}" if sub["reason"] else took


def compare(seen: dict[str, dict[str, list[dict]]], honest: bool = False, same: bool = False
            ) -> tuple[list[str], list[str]]:
    """Per submission a line of verdicts and speedups at idle and under load; and the
    problems: verdicts that moved, cheats above their twins (the twin's interval top, with
    the 1.25x margin the CPU tests allow for noise); with ``honest``, any flag; with ``same``
    (each submission computes the reference's own expression), an interval that leaves out
    1.0 and spans less than a factor of 2 (a figure shown as clear, and wrong)."""
    lines, problems = [], []
    for name, phases in sorted(seen.items()):
        for phase, subs in phases.items():
            for run, sub in enumerate(subs, start=1):
                low, high = sub.get("speedup_ci") or (None, None)
                if honest and sub["status"] == "flagged":
                    problems.append(f"FLAGGED {name} ({phase}, run {run}): {sub['reason']}")
                if same and low and not low <= 1.0 <= high and high < 2 * low:
                    problems.append(f"WRONG INTERVAL {name} ({phase}, run {run}): "
                                    f"{sub['speedup']:.3f}x [{low:.3f}-{high:.3f}]")
    for name in sorted(seen):
        cells = []
        for phase in ("idle", "load"):
            subs = seen[name][phase]
            cells.append(" ".join(s["status"] for s in subs))
            cells.append(" ".join(f"{s['speedup']:.3f}x" if s["speedup"] else "-" for s in subs))
        lines.append(f"{name:28} idle: {cells[0]:24} {cells[1]:28} load: {cells[2]:24} "
                     f"{cells[3]}")
        verdicts = {s["status"] for phase in ("idle", "load") for s in seen[name][phase]}
        if len(verdicts) > 1:
            problems.append(f"MOVED {name}: {cells[0]} at idle, {cells[2]} under load")
    for cheat, twin in TWINS.items():
        for phase in ("idle", "load"):
            for mine, honest in zip(seen.get(cheat, {}).get(phase, []),
                                    seen.get(twin, {}).get(phase, []), strict=False):
                if mine["speedup"] and honest["speedup_ci"] and \
                        mine["speedup"] > 1.25 * honest["speedup_ci"][1]:
                    problems.append(f"ABOVE TWIN ({phase}) {cheat}: {mine['speedup']:.3f}x, "
                                    f"{twin} at most {honest['speedup_ci'][1]:.3f}x")
    return lines, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s [PATH...] [options] [-- kbench options]")
    parser.add_argument("paths", nargs="*", help="default: the CPU cheat fixtures and twin")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--task", help="default: kbench's matching by name, and for the "
                        "default fixtures on CPU l2norm cut down, 2048x4096 timed")
    parser.add_argument("--runs", type=int, default=2, help="grades per phase")
    parser.add_argument("--busy", type=int, default=2 * (os.cpu_count() or 1),
                        help="busy processes under load (default: twice the cores)")
    parser.add_argument("--kind", default="spin", help="spin, cc or nvcc")
    parser.add_argument("--nice", type=int, default=0, help="of the busy processes")
    parser.add_argument("--phases", default="idle,load", type=lambda v: v.split(","),
                        help="which of idle and load each run grades (default both)")
    parser.add_argument("--honest", action="store_true",
                        help="every file is honest: a flag on any is a problem")
    parser.add_argument("--keep", type=Path, help="a folder to keep each run's results.json "
                        "in, as PHASE-RUN.json")
    parser.add_argument("--same", action="store_true", help="every file computes its "
                        "reference's own expression: a clear interval without 1.0 is a problem")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    if not args.phases or not set(args.phases) <= {"idle", "load"}:
        parser.error(f"--phases {','.join(args.phases)}: idle, load or idle,load")
    args.kbench = argv[cut + 1:]  # for kbench grade
    paths = [str(Path(p).resolve()) for p in args.paths] or [str(p) for p in CPU_DEFAULT]
    seen: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    with tempfile.TemporaryDirectory(prefix="kbench-under-load-") as scratch:
        scratch_dir = Path(scratch)
        # the cut-down task for the default fixtures; files given are matched as kbench
        # grade matches them (by name prefix) unless --task says otherwise
        task = Path(args.task) if args.task else \
            cpu_task(scratch_dir) if args.device == "cpu" and not args.paths else None
        for run in range(args.runs):
            seed = secrets.randbits(31)
            for phase in args.phases:
                start = time.monotonic()
                args.phase_run = f"{phase}-{run + 1}"
                with busy(args.busy if phase == "load" else 0, args.kind, args.nice):
                    subs = grade(paths, args, scratch_dir / "out", scratch_dir / "cache",
                                 seed, task)
                for name, sub in subs.items():
                    seen[name][phase].append(sub)
                print(f"run {run + 1}/{args.runs} {phase} (seed {seed}, "
                      f"{time.monotonic() - start:.0f} s): " + ", ".join(
                    f"{n} {s['status']} {_figures(s)}" for n, s in sorted(subs.items())),
                      flush=True)
    lines, problems = compare(seen, args.honest, args.same)
    print(f"\n{args.busy} busy processes ({args.kind}, nice {args.nice}) on "
          f"{os.cpu_count()} cores; verdicts and speedups per run:")
    print("\n".join(lines))
    print("\n".join(problems) or "no verdict moved, no cheat above its twin")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
