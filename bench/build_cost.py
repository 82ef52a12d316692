"""What cold load_inline builds cost on this host: build N submissions from nothing at a given
concurrency and ninja jobs per build (MAX_JOBS), plainly (what a user would run) or as kbench
builds them (its precompiled torch header through the CXX wrapper, one build per distinct code),
and print wall time, builds a second, CPU-seconds per build and the share of each build step.

    python bench/build_cost.py W/subs --first 112 --concurrency 56 --jobs 2 --mode plain
    python bench/build_cost.py W/subs --first 112 --concurrency 56 --jobs 2 --mode kbench \
        --cache /tmp/bc-cache --json bc.json

SAMPLES are files or folders of submissions (every *.py below, in path order): on a GPU host,
the folder bench/real_batch.py lays out (W/subs). Each build imports the file in its own Python
process with an empty TORCH_EXTENSIONS_DIR, as build_phases.py does; its CPU seconds are those
of the process and every compiler it waited for (wait4's rusage). In kbench mode the headers are
built first (their seconds are printed apart) in --cache, and files of the same code are built
once. Several --concurrency and --jobs values run every combination, one after another;
--settings names the combinations instead (plain:16:1 plain:8:2 kbench:16:1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass
class Build:
    path: str
    ok: bool
    wall_s: float
    cpu_s: float
    steps: dict[str, float]  # ninja's seconds per kind of step: cpp, cu, link
    done_s: float = 0.0  # since its configuration began: the first one's is the first wait


@dataclass
class Config:
    mode: str
    concurrency: int
    jobs: int
    submissions: int
    builds: list[Build] = field(default_factory=list)
    wall_s: float = 0.0
    header_s: float = 0.0  # kbench: building the headers first (wall)
    header_cpu_s: float = 0.0
    note: str = ""

    def row(self) -> list[str]:
        done = self.builds
        cpu = statistics.fmean(b.cpu_s for b in done) if done else 0.0
        steps: dict[str, float] = defaultdict(float)
        for b in done:
            for kind, s in b.steps.items():
                steps[kind] += s
        total = sum(steps.values()) or 1.0
        share = " / ".join(f"{steps[k] / total:.0%}" for k in ("cpp", "cu", "link"))
        per_sub = (sum(b.cpu_s for b in done) + self.header_cpu_s) / max(1, self.submissions)
        return [self.mode, str(self.concurrency), str(self.jobs), str(self.submissions),
                f"{len(done)} ({sum(not b.ok for b in done)} failed)", f"{self.wall_s:.0f}",
                f"{len(done) / self.wall_s:.2f}" if self.wall_s else "-", f"{cpu:.1f}",
                f"{per_sub:.1f}",
                f"{statistics.median(b.wall_s for b in done):.0f}" if done else "-",
                f"{min(b.done_s for b in done):.0f}" if done else "-", share,
                f"{self.header_s:.0f} ({self.header_cpu_s:.0f} CPU-s)"]


HEAD = ["mode", "at once", "MAX_JOBS", "submissions", "builds", "wall s", "builds/s",
        "CPU-s/build", "CPU-s/submission (headers incl.)", "median build s",
        "first build done s", "cpp / cu / link (ninja s)", "headers s"]


def samples(paths: list[Path], first: int | None) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        found += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return [p.resolve() for p in found][:first]


def build_one(path: Path, env: dict[str, str], work: Path) -> Build:
    """Import ``path`` in a fresh process building into an empty folder under ``work``."""
    folder = Path(tempfile.mkdtemp(dir=work))
    env = {**env, "TORCH_EXTENSIONS_DIR": str(folder)}
    start = time.perf_counter()
    with (folder / "build.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-c",
                                 f"import runpy; runpy.run_path({str(path)!r})"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    steps: dict[str, float] = defaultdict(float)
    for ninja_log in folder.glob("*/.ninja_log"):
        for line in ninja_log.read_text().splitlines()[1:]:
            begin, end, _, output, _ = line.split("\t")
            kind = "cu" if output.endswith(".cuda.o") else "link" if output.endswith(".so") \
                else "cpp"
            steps[kind] += (int(end) - int(begin)) / 1000
    built = "Error building extension" not in (folder / "build.log").read_text(errors="replace")
    return Build(str(path), built and bool(steps), wall, usage.ru_utime + usage.ru_stime,
                 dict(steps))


def kbench_env(paths: list[Path], cache: Path, config: Config) -> tuple[dict[str, str],
                                                                       list[Path]]:
    """kbench's build environment (headers built first, timed) and one file per distinct
    code (kbench.host.build_dirs)."""
    from kbench.host import pch
    from kbench.host.build_dirs import build_dir
    from kbench.host.toolchain import find_toolchain

    toolchain = find_toolchain()
    before = os.times()
    start = time.perf_counter()
    config.note = pch.prepare(cache, toolchain, [p.read_text(errors="replace") for p in paths],
                              toolchain.env())
    config.header_s = time.perf_counter() - start
    after = os.times()
    config.header_cpu_s = (after.children_user - before.children_user
                           + after.children_system - before.children_system)
    distinct = {build_dir(cache, p, toolchain): p for p in reversed(paths)}
    return {**toolchain.env(), **pch.env(cache, toolchain)}, sorted(distinct.values())


def run(paths: list[Path], mode: str, concurrency: int, jobs: int, cache: Path) -> Config:
    from kbench.host.toolchain import find_toolchain

    config = Config(mode, concurrency, jobs, len(paths))
    env, todo = ({**find_toolchain().env()}, paths) if mode == "plain" else \
        kbench_env(paths, cache, config)
    env = {**os.environ, **env, "MAX_JOBS": str(jobs)}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="build_cost-") as tmp:
        start = time.perf_counter()

        def one(path: Path) -> None:
            built = build_one(path, env, Path(tmp))
            built.done_s = time.perf_counter() - start
            with lock:
                config.builds.append(built)
                print(f"  {len(config.builds)}/{len(todo)} {Path(built.path).name}: "
                      f"{built.wall_s:.0f} s, {built.cpu_s:.0f} CPU-s"
                      + ("" if built.ok else " (not built)"), flush=True)

        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, todo))
        config.wall_s = time.perf_counter() - start
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="submission files or folders")
    parser.add_argument("--first", type=int, help="only the first N files (path order)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[os.cpu_count() or 1])
    parser.add_argument("--jobs", type=int, nargs="+", default=[2], help="MAX_JOBS per build")
    parser.add_argument("--mode", nargs="+", choices=("plain", "kbench"), default=["plain"])
    parser.add_argument("--settings", nargs="+", metavar="MODE:AT_ONCE:JOBS",
                        help="these settings only (plain:16:1 kbench:8:2 ...), in this order, "
                        "in place of every combination of --mode, --concurrency and --jobs")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bc-cache",
                        help="kbench mode's headers (kept between configurations)")
    parser.add_argument("--json", type=Path, help="write every build's figures here")
    args = parser.parse_args()
    paths = samples(args.paths, args.first)
    try:
        settings = [(m, int(c), int(j)) for m, c, j in (s.split(":") for s in args.settings)] \
            if args.settings else [(m, c, j) for m in args.mode for c in args.concurrency
                                   for j in args.jobs]
    except ValueError:
        parser.error("--settings: expected MODE:AT_ONCE:JOBS, say plain:16:1")
    if any(m not in ("plain", "kbench") or c < 1 or j < 1 for m, c, j in settings):
        parser.error("--settings: MODE is plain or kbench, AT_ONCE and JOBS at least 1")
    configs = []
    for mode, concurrency, jobs in settings:
        print(f"{mode}: {len(paths)} submission(s), {concurrency} at once, MAX_JOBS={jobs}",
              flush=True)
        configs.append(run(paths, mode, concurrency, jobs, args.cache))
        print("  | " + " | ".join(configs[-1].row()) + " |", flush=True)
        if configs[-1].note:
            print("  " + configs[-1].note, flush=True)
        if args.json:  # after each: a sweep stopped midway keeps what it measured
            args.json.write_text(json.dumps([asdict(c) for c in configs], indent=1))
    print(f"\nhost: {os.cpu_count()} logical cores; torch "
          f"{__import__('torch').__version__}")
    print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD))
    for config in configs:
        print("| " + " | ".join(config.row()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
