"""The grader's own throughput: grade a generated batch once per configuration and print
submissions per hour (per GPU or slot), build seconds per submission, the mean seconds of
each later stage (load, correctness, timing, kernels) and GPU-busy fraction.

The batch is COUNT copies drawn round-robin from the given submissions (default: the bundled
set), each made distinct by a comment with its number, so every copy builds cold in a fresh
cache and nothing is reused from an earlier run. Every configuration grades the same batch
with the same seed, so its verdicts and speedups can be set side by side: for each submission
correct under both, whether the quick speedup lies inside the full one's interval, and whether
the speedup with several slots lies inside the one-slot interval.

    python bench/throughput.py --count 64 --profiles quick full            # one GPU or CPU
    python bench/throughput.py --count 64 --profiles quick --gpus 0 0,1    # 1 and 2 slots
    python bench/throughput.py --count 8 --device cpu --slots 1 2 --executors local ray \
        --no-timing                          # several CPU slots grade correctness only

``--json FILE`` keeps every figure, with each submission's verdict and speedup interval; it is
rewritten after each configuration, and ``--timeout S`` stops a configuration after S seconds
(its figures then count the results stored by then), so a time-limited machine loses nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
    name: str  # the configuration's folder, e.g. 2-quick-local-gpus-0_1
    profile: str
    executor: str
    slots: str  # "--gpus 0,1" or "--slots 2"
    slot_count: int
    wall_s: float
    finished: bool  # False: stopped by --timeout or failed; figures count what it stored
    submissions: int
    statuses: dict[str, int]
    build_s: list[float]
    gpu_busy: dict[str, float]  # per GPU index: mean utilization over the run, 0-1
    speedups: dict[str, list[float | None]] = field(default_factory=dict)  # name: [s, lo, hi]
    stages: dict[str, float] = field(default_factory=dict)  # stage: mean s per submission

    @property
    def per_hour(self) -> float:
        return self.submissions / self.wall_s * 3600

    def row(self) -> list[str]:
        busy = ", ".join(f"{g}: {b:.0%}" for g, b in sorted(self.gpu_busy.items())) or "-"
        build = f"{statistics.median(self.build_s):.1f}" if self.build_s else "-"
        stages = ", ".join(f"{k} {v:.1f}" for k, v in self.stages.items()) or "-"
        return [self.name, self.profile, self.executor, self.slots, str(self.submissions),
                f"{self.wall_s:.0f}", f"{self.per_hour:.0f}",
                f"{self.per_hour / self.slot_count:.0f}", build, stages, busy,
                ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
                + ("" if self.finished else " (stopped)")]


def make_batch(sources: list[Path], count: int, folder: Path) -> None:
    """``count`` distinct copies, named so each still matches its problem by prefix."""
    folder.mkdir(parents=True)
    for i, src in zip(range(count), itertools.cycle(sources)):
        text = src.read_text() + f"\n# kbench throughput batch copy {i}\n"
        (folder / f"{src.stem}_c{i:03d}.py").write_text(text)


class GpuSampler:
    """nvidia-smi's utilization (share of time a kernel ran) once a second, per GPU."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True).stdout
            for line in out.splitlines():
                index, _, busy = line.partition(",")
                if busy.strip().isdigit():
                    self.samples.setdefault(index.strip(), []).append(int(busy) / 100)

    def mean(self, gpus: list[str] | None) -> dict[str, float]:
        return {g: statistics.fmean(v) for g, v in self.samples.items()
                if v and (gpus is None or g in gpus)}


def grade(batch: Path, scratch: Path, args: argparse.Namespace, profile: str, executor: str,
          placement: list[str], index: int) -> Outcome:
    """One configuration in an output folder of its own (so no result is reused)."""
    place = "-".join(placement).replace(",", "_").strip("-")
    name = f"{index}-{profile}-{executor}" + (f"-{place}" if place else "")
    out, cache = scratch / name / "out", scratch / name / "cache"
    command = [sys.executable, "-m", "kbench", "grade", str(batch), "--profile", profile,
               "--executor", executor, "--seed", str(args.seed), "--device", args.device,
               "--out", str(out), "--cache-dir", str(args.cache or cache), *placement,
               *(["--no-timing"] if args.no_timing else []),
               *(["--jobs", str(args.jobs)] if args.jobs else [])]
    log = scratch / f"{name}.log"
    print(f"{name}: {' '.join(command[3:])}", flush=True)
    start = time.monotonic()
    with GpuSampler() as sampler, log.open("w") as stream:
        process = subprocess.Popen(command, cwd=ROOT, stdout=stream, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            finished = process.wait(timeout=args.timeout) == 0
        except subprocess.TimeoutExpired:  # its slots, workers and compilers go with it
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            finished = False
    wall = time.monotonic() - start
    if not finished:  # the store has every result graded so far: report from it
        subprocess.run([sys.executable, "-m", "kbench", "report", "--out", str(out)], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = out / "results.json"
    subs = json.loads(report.read_text())["submissions"] if report.exists() else []
    gpus = placement[1].split(",") if placement[:1] == ["--gpus"] else None
    statuses: dict[str, int] = {}
    for sub in subs:
        statuses[sub["status"]] = statuses.get(sub["status"], 0) + 1
    count = len(gpus) if gpus else int(placement[1]) if placement[:1] == ["--slots"] else 1
    outcome = Outcome(name, profile, executor, " ".join(placement) or "default", count, wall,
                      finished, len(subs), statuses,
                      [s["build_s"] for s in subs if s.get("build_s")], sampler.mean(gpus),
                      {s["name"]: [s["speedup"], *(s["speedup_ci"] or [None, None])]
                       for s in subs if s["status"] == "ok"}, mean_stages(subs))
    if args.keep:
        shutil.copytree(out, Path(args.keep) / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.so", "*.o"))
        shutil.copy(log, Path(args.keep) / f"{name}.log")
    return outcome


def mean_stages(subs: list[dict]) -> dict[str, float]:
    """Seconds per stage of grading, over the submissions that reached it."""
    seen: dict[str, list[float]] = {}
    for sub in subs:
        for stage, seconds in (sub.get("stage_s") or {}).items():
            seen.setdefault(stage, []).append(seconds)
    return {stage: statistics.fmean(values) for stage, values in seen.items()}


def inside(other: Outcome, base: Outcome) -> list[str]:
    """Per submission timed under both: is ``other``'s speedup inside ``base``'s interval?"""
    lines = []
    for name, (q, _, _) in sorted(other.speedups.items()):
        if name in base.speedups and q is not None and base.speedups[name][1] is not None:
            s, lo, hi = base.speedups[name]
            lines.append(f"  {name}: {q:.3f}x against {s:.3f}x ({lo:.3f}-{hi:.3f}): "
                         + ("inside" if lo <= q <= hi else "OUTSIDE"))
    return lines


def comparisons(outcomes: list[Outcome]) -> list[tuple[str, Outcome, Outcome]]:
    """Quick against full on the same slots; more slots against one on the same profile."""
    pairs = []
    for other, base in itertools.product(outcomes, outcomes):
        same_place = (other.executor, other.slots) == (base.executor, base.slots)
        if (other.profile, base.profile) == ("quick", "full") and same_place or \
                other.profile == base.profile and base.slot_count == 1 < other.slot_count:
            pairs.append((f"{other.name} inside {base.name}'s interval", other, base))
    return pairs


def tables(outcomes: list[Outcome]) -> None:
    header = ["configuration", "profile", "executor", "slots", "subs", "wall s", "subs/h",
              "subs/h/slot", "median build s", "mean s per stage", "GPU busy", "verdicts"]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for outcome in outcomes:
        print("| " + " | ".join(outcome.row()) + " |")
    for title, other, base in comparisons(outcomes):
        print(f"\n{title}:")
        print("\n".join(inside(other, base)) or "  (no submission timed under both)")


def load(files: list[str]) -> list[Outcome]:
    """Outcomes from earlier --json files, each named after its file too."""
    return [Outcome(**{"finished": True, **o, "name": f"{Path(f).stem}/{o.get('name', i)}"})
            for f in files for i, o in enumerate(json.loads(Path(f).read_text()), 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="submissions to copy (default: the bundled)")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--profiles", nargs="+", default=["quick", "full"])
    parser.add_argument("--executors", nargs="+", default=["local"])
    parser.add_argument("--gpus", nargs="+", help="one configuration per value, e.g. 0 0,1")
    parser.add_argument("--slots", nargs="+", help="CPU slots, one configuration per value")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--no-timing", action="store_true", help="correctness only")
    parser.add_argument("--jobs", type=int, help="kbench grade --jobs (default: its own)")
    parser.add_argument("--cache", help="one build cache for every configuration (warm after "
                        "the first); default: a fresh one each, so builds are cold")
    parser.add_argument("--timeout", type=float, help="stop a configuration after this many "
                        "seconds and count what it stored")
    parser.add_argument("--keep", help="copy each run's reports and log here")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--tables", nargs="+", metavar="JSON", help="grade nothing: print the "
                        "tables and comparisons of earlier --json files")
    args = parser.parse_args()
    if args.tables:
        tables(load(args.tables))
        return 0
    sources = [Path(p) for p in args.paths] or sorted((ROOT / "kbench/submissions").glob("*.py"))
    placements = [["--gpus", g] for g in args.gpus or []] + \
        [["--slots", s] for s in args.slots or []] or [[]]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="kbench-throughput-") as tmp:
        batch = Path(tmp) / "batch"
        make_batch(sources, args.count, batch)
        configurations = itertools.product(args.profiles, args.executors, placements)
        for index, (profile, executor, placement) in enumerate(configurations, 1):
            outcomes.append(grade(batch, Path(tmp), args, profile, executor, placement, index))
            print(" | ".join(outcomes[-1].row()), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    tables(outcomes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
