"""Where bench/kernelbench_identity.py's kbench runs go: lanes of cores (and GPUs), batches of
problems packed on them within each GPU's memory, largest first, each run's verdicts read back
from its results.json. A stop at the deadline lets each run write its reports first."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# A batch's time, for --deadline-s: kbench's start and the batch's builds, then each problem
# (on an H200, one kbench run took 12-14 s a problem: docs/evidence/h200x2-2026-11-26-kernelbench).
_BATCH_S, _PROBLEM_S = 40.0, 15.0
_GPU_SHARE = 0.9  # of the device's memory, for the estimates of the batches running at once
# What a batch's kbench processes hold on the device at once, over its largest estimate: up to
# 1.7x on an H200 (91.6 GiB for a 54 GiB estimate; the reference's outputs, the float64
# checks, the candidate's and the reference pool's processes, the allocators' caches).
_HELD = 2.0
_STOP_WAIT_S = 30.0  # a kbench run told to stop (SIGTERM) writes its reports meanwhile


@dataclass
class Lane:
    """Where one kbench run goes: its cores, and its GPU (None: the one it inherits)."""

    cores: list[int]
    gpu: str | None = None


@dataclass
class Batch:
    number: int
    problems: list[str]
    need_gib: float  # the largest estimate among its problems
    alone: bool = True  # no other batch shared its GPU (on a CPU: ran at all) beside it
    proc: subprocess.Popen | None = None
    started: float = 0.0
    lane: Lane = field(default_factory=lambda: Lane([]))
    log: Path | None = None
    read: int = 0  # bytes of its log already scanned for progress lines

    @property
    def held_gib(self) -> float:
        """What its kbench run's processes hold on the device at once, as packing counts it."""
        return _HELD * self.need_gib


def make_lanes(cores: list[int], gpus: list[str | None], count: int) -> list[Lane]:
    """``count`` lanes (at least one a GPU) on ``cores``: each GPU its own slice of the cores,
    split among its lanes; in turn over the GPUs, so that the largest batches spread out."""
    per_gpu = max(1, count // len(gpus))
    lanes = []
    for g, gpu in enumerate(gpus):
        mine = cores[g * len(cores) // len(gpus):(g + 1) * len(cores) // len(gpus)]
        n = min(per_gpu, len(mine))
        lanes.append([Lane(mine[k * len(mine) // n:(k + 1) * len(mine) // n], gpu)
                      for k in range(n)])
    return [per[k] for k in range(max(map(len, lanes))) for per in lanes if k < len(per)]


def gpu_gib(gpu: str | None) -> float | None:
    """That GPU's memory (nvidia-smi; None: the first visible GPU), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    visible = gpu or os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    index = int(visible) if visible.isdigit() and int(visible) < len(out) else 0
    return float(out[index]) / 1024 if out else None


def write_batch(batch: Batch, paths: dict[str, Path], folder: Path) -> Path:
    """The batch's identity candidates under ``folder``."""
    subs = folder / f"b{batch.number:03d}"
    for name in batch.problems:
        target = subs / name / "identity.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(paths[name].read_text() + "\n\nModelNew = Model\n")
    return subs


def start(batch: Batch, subs: Path, problems: Path, args: argparse.Namespace) -> None:
    """One kbench run for the batch, pinned to its lane's cores and GPU, its output in its
    log."""
    out = args.out / "batches" / f"b{batch.number:03d}"
    out.mkdir(parents=True, exist_ok=True)
    cores = set(batch.lane.cores)
    command = [sys.executable, "-m", "kbench", "grade", str(subs), "--task", str(problems),
               "--device", args.device, "--jobs", str(max(2, len(cores) // 2)),
               "--out", str(out)]
    command += [] if args.timing else ["--no-timing"]
    command += ["--case", "0"] if args.own_sizes else []
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cores)), "PYTHONUNBUFFERED": "1"}
    if batch.lane.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = batch.lane.gpu
    batch.log = args.out / "batches" / f"b{batch.number:03d}.log"
    with open(batch.log, "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        batch.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      preexec_fn=lambda: os.sched_setaffinity(0, cores))
    batch.started = time.monotonic()


def collect(batch: Batch, out: Path) -> dict[str, dict]:
    """The batch's verdicts from its results.json, each with its problem's screening."""
    path = out / "batches" / f"b{batch.number:03d}" / "results.json"
    if not path.exists():
        return {}
    results = json.loads(path.read_text())
    problems = {p["name"]: p for p in results.get("problems", [])}
    found = {}
    for sub in results["submissions"]:
        problem = problems.get(sub["problem"], {})
        found[sub["problem"]] = {
            "status": sub["status"], "reason": sub["reason"][:2000],
            "degenerate": problem.get("degenerate"), "error": problem.get("error"),
            "alone": batch.alone, "batch": batch.number,
            "environment": {k: results.get("environment", {}).get(k) for k in
                            ("device_name", "memory_gib", "cpu_count", "torch", "driver",
                             "kbench_version")}}
    return found


class Scheduler:
    """Batches on ``shards`` lanes of cores (and GPUs), largest first, within each GPU's
    memory."""

    def __init__(self, args: argparse.Namespace, paths: dict[str, Path], problems: Path,
                 folder: Path, state: dict, save) -> None:
        self.args, self.paths, self.problems, self.folder = args, paths, problems, folder
        self.state, self.save = state, save
        self.cores = sorted(os.sched_getaffinity(0))
        self.gpus: list[str | None] = args.gpus.split(",") if args.gpus else [None]
        self.lanes = make_lanes(self.cores, self.gpus, args.shards)
        self.budget = {}
        for gpu in self.gpus:
            total = gpu_gib(gpu) if args.device == "cuda" else None
            self.budget[gpu] = _GPU_SHARE * total if total else float("inf")
        self.begun = args.begun  # the command's start: the deadline counts from there
        self.count = 0

    def left_s(self) -> float:
        deadline = self.args.deadline_s
        return float("inf") if deadline is None else deadline - (time.monotonic() - self.begun)

    def batches(self, names: list[str]) -> list[Batch]:
        needs = self.state["needs"]
        names = sorted(names, key=lambda n: -(needs.get(n) or 0.0))
        size = self.args.batch
        made = []
        for i in range(0, len(names), size):
            chunk = names[i:i + size]
            self.count += 1
            made.append(Batch(self.count, chunk, max(needs.get(n) or 0.0 for n in chunk)))
        return made

    def alone_lanes(self) -> list[Lane]:
        """One lane a GPU, each on all of its GPU's cores."""
        return make_lanes(self.cores, self.gpus, len(self.gpus))

    def run(self, todo: list[Batch], lanes: list[Lane]) -> None:
        """Grade ``todo`` on ``lanes``; what a stop leaves ungraded stays missing."""
        running: list[Batch] = []
        free = list(lanes)
        while todo or running:
            if self.left_s() <= 0:
                self._stop(running)
                return
            for batch in self._startable(todo, running, free):
                todo.remove(batch)
                free.remove(batch.lane)
                start(batch, write_batch(batch, self.paths, self.folder), self.problems,
                      self.args)
                running.append(batch)
                gpu = "" if batch.lane.gpu is None else f", GPU {batch.lane.gpu}"
                print(f"[{self._clock()}] b{batch.number:03d} started: {len(batch.problems)} "
                      f"problem(s), up to {batch.need_gib:.1f} GiB, cores "
                      f"{batch.lane.cores[0]}-{batch.lane.cores[-1]}{gpu}", flush=True)
            if not running:
                print(f"[{self._clock()}] {sum(len(b.problems) for b in todo)} problem(s) "
                      "left for a later run: the deadline is too near", flush=True)
                return
            for batch in running:
                if any(other is not batch and other.lane.gpu == batch.lane.gpu
                       for other in running):
                    batch.alone = False
            time.sleep(1.0)
            for batch in list(running):
                self._progress(batch)
                if batch.proc.poll() is not None:
                    running.remove(batch)
                    free.append(batch.lane)
                    self._finished(batch)

    def _startable(self, todo: list[Batch], running: list[Batch],
                   free: list[Lane]) -> list[Batch]:
        """The batches to start now, each with the free lane it goes to: the first (largest)
        that fits beside what runs on that lane's GPU; one too long for the time left is cut
        to what fits (the rest stays to do)."""
        chosen: list[Batch] = []
        left = self.left_s()  # problems that fit in the time left (no deadline: any)
        fits = sys.maxsize if left == float("inf") else int((left - _BATCH_S) // _PROBLEM_S)
        if fits < 1:
            return []
        for lane in free:
            beside = [b for b in running + chosen if b.lane.gpu == lane.gpu]
            used = sum(b.held_gib for b in beside)
            batch = next((b for b in todo if b not in chosen and not (
                beside and used + b.held_gib > self.budget[lane.gpu])), None)
            if batch is None:
                continue
            if fits < len(batch.problems):
                self.count += 1
                rest = Batch(self.count, batch.problems[fits:], batch.need_gib)
                batch.problems = batch.problems[:fits]
                todo.insert(todo.index(batch) + 1, rest)
            batch.lane = lane
            chosen.append(batch)
        return chosen

    def _finished(self, batch: Batch) -> None:
        found = collect(batch, self.args.out)
        self.state["results"].update(found)
        self.save()
        missing = len(batch.problems) - len(found)
        print(f"[{self._clock()}] b{batch.number:03d} done in "
              f"{time.monotonic() - batch.started:.0f} s (exit {batch.proc.returncode}"
              f"{'' if batch.alone else ', beside others'}): {len(found)} verdict(s)"
              + (f", {missing} without one" if missing else ""), flush=True)

    def _stop(self, running: list[Batch]) -> None:
        """The deadline: each kbench run stopped as Ctrl-C would, its reports kept."""
        print(f"[{self._clock()}] deadline: stopping {len(running)} batch(es)", flush=True)
        for batch in running:
            batch.proc.send_signal(signal.SIGTERM)
        for batch in running:
            try:
                batch.proc.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                batch.proc.kill()
                batch.proc.wait()
            self._progress(batch)
            self._finished(batch)

    def _progress(self, batch: Batch) -> None:
        """The verdict lines its kbench printed since last time, prefixed with the batch."""
        with open(batch.log, errors="replace") as log:
            log.seek(batch.read)
            text = log.read()
        complete = text[:text.rfind("\n") + 1]
        batch.read += len(complete.encode(errors="replace"))
        for line in complete.splitlines():
            if line.startswith("["):
                print(f"  b{batch.number:03d} {line[:200]}", flush=True)

    def _clock(self) -> str:
        return f"{time.monotonic() - self.begun:5.0f} s"
