"""Grade ModelNew = Model against every problem of a KernelBench checkout: how many problems
kbench takes as they are. Writes one candidate per problem (the problem's own source plus
`ModelNew = Model`) in the `<level>/<problem>/identity.py` layout outside the repository,
grades them with `kbench grade` in batches, and prints which problems did not pass and why.

    python bench/kernelbench_identity.py /path/to/KernelBench --levels 1 2 3 --device cpu
    python bench/kernelbench_identity.py KB --levels 1 2 3 --device cuda --own-sizes \
        --shards 4 --results /tmp/kbid/identity.json --deadline-s 470

Batches of ``--batch`` problems go to ``--shards`` kbench runs side by side, each on its own
share of the cores (its grading pinned there by kbench's host split); with ``--gpus`` the runs
are spread over those GPUs, each GPU's runs on its share of the cores. On a GPU a batch starts
only where its problems' device memory, as kbench's screening estimates it (three times the
reference's peak on the meta device: float32 and float64) and twice that for what kbench's
processes hold beside it, fits beside the batches running on that GPU;
the largest go first. A problem that failed on a resource (memory, a CUDA error, a timeout, a
crash) while other batches shared its GPU (or its cores, on a CPU) is graded again alone at
the end: one batch on each GPU at a time. Every verdict is kept in
``--results``: run again with the same file and only what is missing is graded, so
``--deadline-s`` (no batch starts that would not end by then; running ones are stopped at it)
lets several device calls finish a long set.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
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
# Failures another batch on the same GPU or cores can cause: graded again alone.
_RESOURCE = {"out_of_memory", "cuda_error", "timeout", "crashed", "internal_error",
             "infrastructure_error"}
_RESOURCE_WORDS = ("out of memory", "GiB of device memory", "CUDA", "CUBLAS", "CUDNN",
                   "timed out", "not enough memory")


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


def list_problems(root: Path, levels: list[int], only: list[str]) -> dict[str, Path]:
    """``level1/19_ReLU`` -> its file, for the levels asked (``only``: names holding a word)."""
    found = {}
    for level in levels:
        for path in sorted((root / f"level{level}").glob("*.py")):
            if not only or any(word in path.stem for word in only):
                found[f"level{level}/{path.stem}"] = path
    return found


def _need(path: str) -> float | None:
    """GiB kbench's screening counts for the reference at the file's own sizes, or None."""
    try:
        from kbench.problems.trial import on_meta
        from kbench.shared import inputs

        module = inputs.load_file(path, f"kbid_{abs(hash(path))}")
        return 3 * on_meta(module, inputs.own_sizes(module)).peak_bytes / 2**30
    except Exception:  # the reference's own failure shows when it is graded
        return None


def estimate_needs(paths: dict[str, Path], known: dict[str, float | None]) -> None:
    """Fill ``known`` with each problem's estimate, on every core at once."""
    todo = [name for name in paths if name not in known]
    if not todo:
        return
    start = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(min(len(todo), os.cpu_count() or 1)) as pool:
        for name, need in zip(todo, pool.map(_need, [str(paths[n]) for n in todo], chunksize=1),
                              strict=True):
            known[name] = need
    print(f"memory estimates of {len(todo)} problem(s) in {time.monotonic() - start:.0f} s",
          flush=True)


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


def needs_alone(record: dict) -> bool:
    """A failure that another batch beside it could have caused, not yet seen alone."""
    if record["status"] == "ok" or record.get("alone"):
        return False
    text = f"{record.get('reason', '')} {record.get('error') or ''}"
    return record["status"] in _RESOURCE or any(w.lower() in text.lower()
                                                for w in _RESOURCE_WORDS)


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
        for lane in free:
            beside = [b for b in running + chosen if b.lane.gpu == lane.gpu]
            used = sum(b.held_gib for b in beside)
            batch = next((b for b in todo if b not in chosen and fits >= 1 and not (
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


def summary(names: list[str], state: dict) -> list[str]:
    """What the results file says of ``names``: the share of non-degenerate problems ok, and
    every problem that is degenerate, failed, or has no verdict yet."""
    results = {n: state["results"][n] for n in names if n in state["results"]}
    degenerate = {n for n, r in results.items() if r.get("degenerate")}
    plain = [n for n in results if n not in degenerate]
    ok = sum(results[n]["status"] == "ok" for n in plain)
    missing = [n for n in names if n not in results]
    envs = {json.dumps(r.get("environment"), sort_keys=True) for r in results.values()}
    lines = [f"{len(results)} of {len(names)} problem(s) have a verdict "
             f"({dict(Counter(r['status'] for r in results.values()))}); "
             f"{len(degenerate)} degenerate; non-degenerate ok: {ok} of {len(plain)} "
             f"({100 * ok / max(1, len(plain)):.1f} %)", *sorted(envs)]
    for name in sorted(degenerate):
        lines.append(f"- {name}: degenerate ({results[name]['status']}): "
                     f"{results[name]['degenerate'][:300]}")
    for name in sorted(n for n in plain if results[n]["status"] != "ok"):
        record = results[name]
        alone = "" if record.get("alone") else " (graded beside others)"
        lines.append(f"- {name}: {record['status']}{alone}: {record['reason'][:400]}")
    lines += [f"- {name}: no verdict yet" for name in missing]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a KernelBench clone (its KernelBench/ "
                        "folder holds level1, level2, ...)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--timing", action="store_true", help="time them too (default: "
                        "correctness only)")
    parser.add_argument("--only", nargs="*", default=[], help="problems whose name holds one "
                        "of these words")
    parser.add_argument("--own-sizes", action="store_true", help="only case 0, the problem's "
                        "own sizes (no random cases, no timing)")
    parser.add_argument("--shards", type=int, default=1, help="kbench runs side by side, each "
                        "on its share of the cores (on a GPU, within its memory)")
    parser.add_argument("--batch", type=int, default=10, help="problems per kbench run")
    parser.add_argument("--gpus", help="GPUs to spread the runs over, e.g. 0,1,2 (physical "
                        "indices; default: the first visible GPU)")
    parser.add_argument("--deadline-s", type=float, help="start no batch that would not end "
                        "within this many seconds of the start; stop the running ones then")
    parser.add_argument("--results", type=Path, help="the verdicts so far (JSON), read and "
                        "added to (default: OUT/identity.json)")
    parser.add_argument("--out", type=Path, default=Path("kernelbench-identity"))
    begun = time.monotonic()
    args = parser.parse_args()
    args.begun = begun
    problems = args.checkout / "KernelBench"
    if not problems.is_dir():
        problems = args.checkout
    paths = list_problems(problems, args.levels, args.only)
    results_path = args.results or args.out / "identity.json"
    state = json.loads(results_path.read_text()) if results_path.exists() else {}
    state.setdefault("results", {})
    state.setdefault("needs", {})
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(state, indent=1, sort_keys=True))

    if args.device == "cuda":
        estimate_needs(paths, state["needs"])
        save()
    todo = [n for n in paths if n not in state["results"]]
    print(f"{len(paths)} problem(s), {len(todo)} without a verdict", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        scheduler = Scheduler(args, paths, problems, Path(tmp), state, save)
        scheduler.run(scheduler.batches(todo), scheduler.lanes)
        again = [n for n in paths if n in state["results"] and needs_alone(state["results"][n])]
        if again:
            print(f"grading {len(again)} problem(s) again alone: {', '.join(again)}", flush=True)
            scheduler.run(scheduler.batches(again), scheduler.alone_lanes())
    print("\n" + "\n".join(summary(list(paths), state)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
