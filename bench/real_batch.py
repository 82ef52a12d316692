"""kbench against KernelBench's own batch evaluator on real model-written kernels.

bench/throughput.py grades copies of kbench's own kernels, which all build and pass; a real batch
fails to build, hangs and fails in every other way. This lays out the public KernelBench
leaderboard's samples (a checkout of anneouyang/KernelBenchLeaderboard), grades them with
``kbench grade`` while sampling GPU utilization and per-core busy %, and with ``--kernelbench``
runs KernelBench's scripts/eval_from_generations.py on the same samples and problem files on the
same host, and prints both side by side. raw_data.json's ``problem_id`` counts from 0 (problem
file ``l{L}_p{problem_id+1}.py``, checked against data.json's keys); data.json lists only each
problem's five best samples, so counting its entries finds fewer samples than there are.

    python bench/real_batch.py --leaderboard LB --work W --out W/out --levels 1 --first 100 \
        --kernelbench KB --json W/real.json [--timeout S] -- --profile quick
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_LINE = re.compile(r": \S+ (?:built in \d+ s|not built)")  # kbench says one as each ends
RESULT_LINE = re.compile(r"^\[\d+/\d+\] ")  # and one per result
ARCHS = {"7.0": "Volta", "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere",
         "8.9": "Ada", "9.0": "Hopper"}  # compute capability: KernelBench's gpu_arch name
# eval_from_generations.py imports modal, and through kernelbench.utils openai and litellm, at
# module level, for paths a local evaluation never takes (Modal's cloud, LLM queries): each is
# replaced by this stand-in, whose every attribute, call and decorator gives the stand-in itself.
STUB = ("class _Any:\n    def __init__(self, *a, **k): pass\n    def __getattr__(self, name): "
        "return self\n    def __call__(self, *a, **k): return self\n"
        "def __getattr__(name): return _Any()\n")
# Its per-sample timeout, 180 s by default, also bounds each build of its compile stage, which
# then deletes the build's folder: 100 samples built at once on 64 cores (an H100 host,
# 2026-11-27) took longer, every build's folder was removed under its compiler, and its run
# evaluated nothing in 516 s.
KB_TIMEOUT_S = 900
STUBS = ("modal/__init__.py", "modal/experimental.py", "openai.py", "litellm.py")


@dataclass(frozen=True)
class Sample:
    level: int
    number: int  # the problem's KernelBench number
    problem: str  # its KernelBench name: 19_ReLU
    model: str  # as a file name allows
    file: str  # the leaderboard's hash of the sample
    code: str

    @property
    def path(self) -> str:
        return f"level{self.level}/{self.problem}/{self.model}__{self.file}.py"


@dataclass
class Census:
    """What raw_data.json held and what became of it."""

    entries: int = 0
    duplicates: int = 0  # the same (level, problem, file) again
    offset: int = 1  # problem file number = problem_id + offset
    offset_agreed: int = 0  # samples data.json lists under a problem of that number
    offset_disagreed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # missing problem file: samples
    unnamed: int = 0  # samples whose problem data.json does not name
    usable: int = 0
    in_data_json: int = 0  # usable samples listed in data.json's top-5 tables
    selected: int = 0

    def lines(self) -> list[str]:
        where = ", ".join(f"{k} x{v}" for k, v in sorted(self.skipped.items()))
        return [f"raw_data.json: {self.entries} samples, {self.duplicates} duplicate(s) dropped",
                f"problem file = l{{L}}_p{{problem_id + {self.offset}}}.py (data.json agrees for "
                f"{self.offset_agreed} samples, disagrees for {self.offset_disagreed})",
                f"skipped, no problem file: {sum(self.skipped.values())}"
                + (f" ({where})" if where else ""),
                f"usable: {self.usable} ({self.in_data_json} of them in data.json's top-5 "
                f"tables, {self.usable - self.in_data_json} not; {self.unnamed} with a problem "
                "data.json does not name)", f"selected: {self.selected}"]


def id_offset(raw: list[dict], data: dict, census: Census) -> int:
    """The offset from raw_data.json's problem_id to the problem's number on which the
    samples data.json lists under a "Level L: N_Name" key agree (1 where none is listed)."""
    listed = {e["file"]: key for key, entries in data.items() for e in entries}
    offsets: Counter[int] = Counter()
    for row in {row["file"]: row for row in raw}.values():
        if (key := listed.get(row["file"])) and (m := re.match(r"Level \d+: (\d+)_", key)):
            offsets[int(m[1]) - int(row["problem_id"])] += 1
    offset = offsets.most_common(1)[0][0] if offsets else 1
    census.offset, census.offset_agreed = offset, offsets[offset]
    census.offset_disagreed = sum(offsets.values()) - offsets[offset]
    return offset


def read_leaderboard(checkout: Path, levels: set[int] | None = None,
                     first: int | None = None) -> tuple[list[Sample], Census]:
    """The usable samples of ``levels`` in path order (only the first ``first``)."""
    assets = checkout / "docs" / "assets"
    raw = json.loads((assets / "raw_data.json").read_text())
    data = json.loads((assets / "data.json").read_text())
    census = Census(entries=len(raw))
    offset, listed = id_offset(raw, data, census), {e["file"] for v in data.values() for e in v}
    names = {(int(m[1]), int(m[3])): m[2] for key in data
             if (m := re.match(r"Level (\d+): ((\d+)_.*)$", key))}
    seen, samples = set(), []
    for row in raw:
        level, number = int(row["level"]), int(row["problem_id"]) + offset
        if (level, number, row["file"]) in seen:
            census.duplicates += 1
            continue
        seen.add((level, number, row["file"]))
        if not (assets / "problems" / f"l{level}_p{number}.py").is_file():
            census.skipped[f"l{level}_p{number}"] = census.skipped.get(f"l{level}_p{number}", 0) + 1
            continue
        census.usable += 1
        census.unnamed += (level, number) not in names
        census.in_data_json += row["file"] in listed
        model = re.sub(r"[^A-Za-z0-9.-]+", "-", str(row["model"])).strip("-") or "model"
        if levels is None or level in levels:
            samples.append(Sample(level, number, names.get((level, number), f"{number}_problem"),
                                  model, str(row["file"]), row["code"]))
    samples = sorted(samples, key=lambda s: s.path)[:first]
    census.selected = len(samples)
    return samples, census


def lay_out(samples: list[Sample], checkout: Path, work: Path) -> None:
    """WORK/subs/levelL/PROBLEM/MODEL__HASH.py and WORK/problems/levelL/PROBLEM.py, anew."""
    for folder in ("subs", "problems"):
        shutil.rmtree(work / folder, ignore_errors=True)
    for s in samples:
        sub, problem = work / "subs" / s.path, work / "problems" / f"level{s.level}/{s.problem}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        problem.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(s.code)
        shutil.copyfile(checkout / f"docs/assets/problems/l{s.level}_p{s.number}.py", problem)


def nvidia_smi(query: str) -> list[list[str]]:
    """One row per GPU (nvidia-smi's index order); none where there is no nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return [[v.strip() for v in line.split(",")] for line in out.splitlines() if line.strip()]


class Sampler(threading.Thread):
    """Every ``every`` s until stopped: each GPU's utilization and each core's busy %,
    stamped with time.monotonic(); then ``tick()``."""

    def __init__(self, tick: Callable[[], None], every: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.tick, self.every, self.stopped = tick, every, threading.Event()
        self.cpu: list[tuple[float, list[float]]] = []
        self.gpu: dict[str, list[float]] = {}

    def run(self) -> None:
        import psutil  # a kbench dependency

        psutil.cpu_percent(percpu=True)  # starts the first interval
        while not self.stopped.wait(self.every):
            self.cpu.append((time.monotonic(), psutil.cpu_percent(percpu=True)))
            for index, busy in nvidia_smi("index,utilization.gpu"):
                if busy.isdigit():
                    self.gpu.setdefault(index, []).append(float(busy))
            self.tick()

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=30)

    def gpu_busy(self) -> dict[str, float]:
        return {g: round(statistics.fmean(v), 1) for g, v in self.gpu.items() if v}

    def cpu_busy(self, cores: list[int] | None, windows: list[tuple[float, float]]
                 ) -> float | None:
        """Mean busy % of ``cores`` (None: all) over the samples whose interval overlaps a
        window (time.monotonic() start and end)."""
        rows = [busy for t, busy in self.cpu if any(t > a and t - self.every < b
                                                    for a, b in windows)]
        values = [row[c] for row in rows for c in cores if c < len(row)] if cores is not None \
            else [statistics.fmean(row) for row in rows]
        return round(statistics.fmean(values), 1) if values else None


@dataclass
class Figures:
    """One tool's run over the batch; while it runs, samples and wall_s count as it goes."""

    tool: str
    slots: int  # GPUs (or CPU slots) it graded on
    command: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    finished: bool = False  # False: stopped by --timeout or failed; figures count what it stored
    exit_code: int | None = None
    samples: int = 0  # results stored
    verdicts: dict[str, int] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=dict)  # mean s per sample reaching it
    gpu_busy: dict[str, float] = field(default_factory=dict)  # % per GPU index, whole run
    build_busy: float | None = None  # % of the build cores until the last build ended
    build_busy_of: str = ""  # which cores, over which window, and how its end was found
    build_s: list[float] = field(default_factory=list)  # when each build line came (s from start)
    notes: list[str] = field(default_factory=list)

    @property
    def per_hour_per_gpu(self) -> float:
        return self.samples / self.wall_s * 3600 / self.slots if self.wall_s else 0.0


def execute(command: list[str], cwd: Path, env: dict[str, str], log: Path,
            timeout: float | None, on_line: Callable[[float, str], None]
            ) -> tuple[int | None, bool]:
    """Run ``command`` in a session of its own, each output line passed on with its time
    and copied to ``log`` and stdout; its process group is killed at ``timeout`` (or on an
    interrupt). Returns its exit code, and whether it ended by itself with 0."""
    print("$ " + " ".join(command), flush=True)
    with log.open("w") as stream:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, errors="replace",
                                   start_new_session=True)

        def read() -> None:
            for line in process.stdout:
                on_line(time.monotonic(), line)
                stream.write(line)
                print(line, end="", flush=True)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        ended = True
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            ended = False
        finally:
            if process.poll() is None:  # its slots, pools and compilers go with it
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            reader.join(timeout=30)
    return process.returncode, ended and process.returncode == 0


def option(options: list[str], flag: str) -> str | None:
    """The value of a kbench option given as ``--flag V`` or ``--flag=V``."""
    for i, arg in enumerate(options):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(options):
            return options[i + 1]
    return None


def count_slots(options: list[str]) -> int:
    """GPUs kbench grades on: --gpus, else CPU --slots, else every visible GPU (those
    CUDA_VISIBLE_DEVICES names, else every one nvidia-smi lists)."""
    gpus = option(options, "--gpus")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return len(gpus.split(",")) if gpus else \
        int(option(options, "--slots") or 0) or \
        (len(visible.split(",")) if visible else len(nvidia_smi("index"))) or 1


def kbench_run(figures: Figures, work: Path, samples: list[Sample], options: list[str],
               args: argparse.Namespace, sampler: Sampler) -> None:
    """``figures.command`` (kbench grade); the figures from its results.json, rendered from
    the store when it was stopped. The build window ends at its last build line."""
    builds: list[float] = []
    start = time.monotonic()

    def on_line(t: float, line: str) -> None:
        figures.wall_s = t - start
        figures.samples += bool(RESULT_LINE.match(line))
        if BUILD_LINE.search(line):
            builds.append(t)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    figures.exit_code, figures.finished = execute(figures.command, ROOT, env,
                                                  work / "kbench.log", args.timeout, on_line)
    end = time.monotonic()
    figures.wall_s = end - start
    out = args.out.resolve()
    if not figures.finished:
        subprocess.run([sys.executable, "-m", "kbench", "report", "--out", str(out)], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = out / "results.json"
    run = json.loads(report.read_text()) if report.exists() else {}
    subs = run.get("submissions", [])
    figures.samples, figures.verdicts = len(subs), dict(Counter(s["status"] for s in subs))
    ruled = Counter(s["kernelbench"]["status"] for s in subs if s.get("kernelbench"))
    if ruled:
        figures.notes.append("verdicts under KernelBench's rules: "
                             + ", ".join(f"{k} {v}" for k, v in sorted(ruled.items())))
    stages: dict[str, list[float]] = {}
    for sub in subs:
        for stage, seconds in [("build", sub.get("build_s")), *(sub.get("stage_s") or {}).items()]:
            if seconds is not None:
                stages.setdefault(stage, []).append(seconds)
    figures.stage_s = {k: round(statistics.fmean(v), 2) for k, v in stages.items()}
    figures.notes += timing_cost(subs, figures.wall_s, figures.slots)
    figures.gpu_busy = sampler.gpu_busy()
    split = (run.get("environment") or {}).get("host_split") or {}
    cores = split.get("build_cores", split.get("build"))  # the build cores, if kbench said
    last = max(builds, default=end)
    figures.build_busy = sampler.cpu_busy(cores, [(start, last)])
    figures.build_busy_of = (f"build cores {cores}" if cores else "all cores (no host_split)") + \
        f", first {last - start:.0f} s: until " + \
        ("its last build line" if builds else "the run's end (no build line seen)")
    figures.build_s = [round(t - start, 1) for t in builds]
    if builds:
        figures.notes.append(build_pace(figures.build_s))


def build_pace(times: list[float]) -> str:
    """How builds came out: the first, those in the first minute, the rate over the window
    from the start to the last (a stalled pool shows as a gap and a falling rate)."""
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    return (f"{len(times)} build lines, the first at {times[0]:.0f} s, "
            f"{sum(t <= 60 for t in times)} in the first 60 s, "
            f"{len(times) / max(times[-1], 1e-9):.3f} a second until the last at "
            f"{times[-1]:.0f} s, longest gap {max(gaps):.0f} s")


def timing_cost(subs: list[dict], wall_s: float, slots: int) -> list[str]:
    """GPU-seconds of timing per timed sample (a slot holds its GPU while it times), by part,
    and timing's share of the GPUs' time over the run: near 1, timing bounds the batch."""
    timed = [s for s in subs if "timing" in (s.get("stage_s") or {})]
    if not timed:
        return []
    total = sum(s["stage_s"]["timing"] for s in timed)
    parts: Counter[str] = Counter()
    for sub in timed:
        parts.update(sub.get("timing_s") or {})
    disturbed = sum(1 for s in timed if (s.get("timed_beside") or {}).get("disturbed"))
    again = sum(1 for s in timed if (s.get("timed_beside") or {}).get("retimed_alone"))
    return [f"timing: {total / len(timed):.1f} GPU-s per timed sample ({len(timed)} timed; "
            + ", ".join(f"{k} {v / len(timed):.1f}" for k, v in parts.most_common())
            + f"); {total / max(1e-9, wall_s * slots):.0%} of the GPUs' time over the run; "
            f"{disturbed} timed on a disturbed host, {again} timed again alone"]


def kb_prepare(checkout: Path, work: Path, samples: list[Sample], options: list[str]
               ) -> tuple[Path, int, dict[str, str]]:
    """WORK/kernelbench: KernelBench's scripts/ and src/, the stand-ins, and one KernelBench/
    levelL of the leaderboard's problem files (the evaluator reads problems only beside its
    src/; L only names folders and files: 9 where the batch mixes levels); one problem id per
    sample, the sample its sample 0 (samples per problem differ, and the evaluator takes each
    problem's samples 0..num_samples_per_problem-1). Also its run's level and environment."""
    root, levels = work / "kernelbench", {s.level for s in samples}
    level = levels.pop() if len(levels) == 1 else 9
    fresh = ("runs", "cache") if "--resume" not in options else ()
    for folder in ("scripts", "src", "KernelBench", "shim", *fresh):
        shutil.rmtree(root / folder, ignore_errors=True)
    shutil.copytree(checkout / "scripts", root / "scripts")
    shutil.copytree(checkout / "src", root / "src")
    for name in STUBS:
        (root / "shim" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "shim" / name).write_text(STUB)
    problems, run = root / f"KernelBench/level{level}", root / f"runs/rb_level{level}"
    problems.mkdir(parents=True)
    run.mkdir(parents=True, exist_ok=True)
    for pid, s in enumerate(samples, 1):
        shutil.copyfile(work / f"problems/level{s.level}/{s.problem}.py",
                        problems / f"{pid}_{s.problem.split('_', 1)[-1]}.py")
        (run / f"level_{level}_problem_{pid}_sample_0_kernel.py").write_text(s.code)
    (run / "samples.json").write_text(json.dumps(dict(enumerate((s.path for s in samples), 1))))
    path = [str(root / "src"), str(root / "shim"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p),
           "PYTHONUNBUFFERED": "1"}
    if gpus := option(options, "--gpus"):  # numbered as torch numbers the visible ones
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible.split(",")[int(g)] if visible else g
                                               for g in gpus.split(","))
    return root, level, env


def kb_arguments(level: int, root: Path, slots: int, options: list[str], extra: list[str]
                 ) -> list[str]:
    """pydra overrides: its run and build folders, our GPUs and their architecture, kbench's
    --no-timing as measure_performance=False, builds cached first on every core (its README's
    advice for speed), its timeout (KB_TIMEOUT_S unless given), then --kb-arg's."""
    caps = nvidia_smi("compute_cap")
    given = re.match(r"\d+\.\d", option(options, "--cuda-arch") or (caps[0][0] if caps else ""))
    cap = given[0] if given else "9.0"
    arch = ARCHS.get(cap, "Blackwell" if float(cap) >= 10 else "Hopper")
    return [f"run_name=rb_level{level}", "dataset_src=local", f"level={level}",
            f"runs_dir={root / 'runs'}", f"kernel_eval_build_dir={root / 'cache'}",
            f"num_gpu_devices={slots}", f"gpu_arch=['{arch}']", "build_cache=True",
            f"num_cpu_workers={os.cpu_count() or 1}",
            f"measure_performance={'--no-timing' not in options}",
            *([] if any(e.startswith("timeout=") for e in extra) else [f"timeout={KB_TIMEOUT_S}"]),
            *extra]


def kb_run(figures: Figures, work: Path, samples: list[Sample], options: list[str],
           args: argparse.Namespace, sampler: Sampler) -> None:
    """eval_from_generations.py over the batch; the figures from its eval_results.json:
    correct, wrong (compiled, not correct), error (compiled is false: no build, or a crash or
    CUDA error while it ran), timeout (its per-batch deadline). Its build stage (build_cache)
    ends where its first batch of evaluations begins."""
    root, level, env = kb_prepare(args.kernelbench.resolve(), work, samples, options)
    figures.command = [sys.executable, str(root / "scripts/eval_from_generations.py"),
                       *kb_arguments(level, root, figures.slots, options, args.kb_arg)]
    start, batches = time.monotonic(), []

    def on_line(t: float, line: str) -> None:
        figures.wall_s = t - start
        figures.samples += "Adding Eval Result to file" in line  # (after a progress bar, too)
        if "[Curr Batch]" in line:
            batches.append(t)

    figures.exit_code, figures.finished = execute(figures.command, root, env,
                                                  work / "kernelbench.log", args.timeout, on_line)
    end = time.monotonic()
    results = root / f"runs/rb_level{level}/eval_results.json"
    verdicts: Counter[str] = Counter()
    for entries in (json.loads(results.read_text()) if results.exists() else {}).values():
        for e in entries:
            timed_out = (e.get("metadata") or {}).get("error") == "Evaluation timed out"
            verdicts["timeout" if timed_out else "correct" if e["correctness"] else
                     "wrong" if e["compiled"] else "error"] += 1
    figures.wall_s, figures.samples, figures.verdicts = end - start, verdicts.total(), \
        dict(verdicts)
    figures.gpu_busy = sampler.gpu_busy()
    figures.build_busy = sampler.cpu_busy(None, [(start, batches[0] if batches else end)])
    figures.build_busy_of = f"all cores, first {(batches[0] if batches else end) - start:.0f} " \
        "s: until " + ("its first batch of evaluations" if batches else "the run's end")


def table(runs: list[Figures]) -> str:
    """The tools side by side, each one's windows, stages and notes below."""
    lines = ["| tool | samples | wall s | samples/h/GPU | GPUs | GPU busy % | build-core busy % "
             "| verdicts |", "|---|---|---|---|---|---|---|---|"]
    for f in runs:
        busy = ", ".join(f"{g}: {b:.0f}" for g, b in sorted(f.gpu_busy.items())) or "-"
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(f.verdicts.items())) or "-"
        build = "-" if f.build_busy is None else f"{f.build_busy:.0f}"
        lines.append(f"| {f.tool} | {f.samples} | {f.wall_s:.0f} | {f.per_hour_per_gpu:.0f} | "
                     f"{f.slots} | {busy} | {build} | {verdicts}"
                     f"{'' if f.finished else ' (stopped)'} |")
    for f in runs:
        lines.append(f"{f.tool}: build-core busy over {f.build_busy_of}")
        if f.stage_s:
            lines.append(f"{f.tool}: mean s per stage: "
                         + ", ".join(f"{k} {v:.1f}" for k, v in f.stage_s.items()))
        lines += [f"{f.tool}: {note}" for note in f.notes]
    if len(runs) == 2 and runs[1].wall_s and runs[1].per_hour_per_gpu:
        lines.append(f"kbench/KernelBench: wall time {runs[0].wall_s / runs[1].wall_s:.2f}x, "
                     f"samples/h/GPU {runs[0].per_hour_per_gpu / runs[1].per_hour_per_gpu:.2f}x")
    return "\n".join(lines)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options, and kbench grade's (everything after ``--``)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s --leaderboard DIR --work DIR --out DIR "
                                     "[options] [-- KBENCH_GRADE_OPTIONS]")
    parser.add_argument("--leaderboard", type=Path, required=True,
                        help="a checkout of anneouyang/KernelBenchLeaderboard")
    parser.add_argument("--work", type=Path, required=True, help="where the batch is laid out")
    parser.add_argument("--out", type=Path, help="kbench's --out (required unless --layout-only)")
    parser.add_argument("--kernelbench", type=Path, help="a checkout of KernelBench: run its "
                        "scripts/eval_from_generations.py on the same samples too")
    parser.add_argument("--kb-baseline", type=Path, help="KernelBench's reference times "
                        "(its generate_baseline_time.py's JSON), for its speedups where its "
                        "eval_results.json has no ref_runtime")
    parser.add_argument("--kb-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="another eval_from_generations.py override, e.g. timeout=300")
    parser.add_argument("--levels", type=lambda s: {int(v) for v in s.split(",")})
    parser.add_argument("--first", "--limit", type=int, dest="first",
                        help="only the first N samples by path")
    parser.add_argument("--json", type=Path, help="every figure, rewritten as it goes")
    parser.add_argument("--timeout", type=float, help="stop each tool after S seconds and count "
                        "what it stored (kbench: finish later with -- --resume)")
    parser.add_argument("--deadline-s", type=float, help="stop whatever tool runs this many "
                        "seconds after the start (with --timeout, the earlier of the two)")
    parser.add_argument("--layout-only", action="store_true", help="lay out and count only")
    args = parser.parse_args(argv[:cut])
    if not args.layout_only and args.out is None:
        parser.error("--out is required unless --layout-only")
    return args, argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    # A SIGTERM (a lent machine's time limit) unwinds: the running tool's group is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args, options = parse(sys.argv[1:] if argv is None else argv)
    samples, census = read_leaderboard(args.leaderboard, args.levels, args.first)
    work, runs, lock = args.work.resolve(), [], threading.Lock()
    lay_out(samples, args.leaderboard, work)
    print("\n".join(census.lines()), flush=True)

    def save() -> None:  # whole, then renamed: a killed run keeps what it had
        with lock:
            if args.json:
                figures = [{**asdict(f), "per_hour_per_gpu": f.per_hour_per_gpu} for f in runs]
                temporary = args.json.with_name(args.json.name + ".tmp")
                temporary.write_text(json.dumps({"census": asdict(census), "samples": [
                    s.path for s in samples], "runs": figures}, indent=1))
                temporary.replace(args.json)

    save()
    if args.layout_only or not samples:
        return 0
    out = args.out.resolve()
    if (out / "kbench.sqlite3").exists() and "--resume" not in options:
        print(f"{out} holds a kbench store already, whose results would be reused: give a new "
              "--out, or -- --resume to finish its run", file=sys.stderr)
        return 2
    if option(options, "--cache-dir") is None:  # builds cold, as KernelBench's fresh folders
        if "--resume" not in options:
            shutil.rmtree(work / "kbench-cache", ignore_errors=True)
        options = [*options, "--cache-dir", str(work / "kbench-cache")]
    runs.append(Figures("kbench", count_slots(options), [
        sys.executable, "-m", "kbench", "grade", str(work / "subs"), "--task",
        str(work / "problems"), "--out", str(out), *options]))
    for index, tool in enumerate([kbench_run] + ([kb_run] if args.kernelbench else [])):
        if index:
            runs.append(Figures("KernelBench", runs[0].slots))
        if args.deadline_s is not None:  # never 0: a timeout of 0 would stop nothing
            left = max(1.0, args.deadline_s - (time.monotonic() - started))
            args.timeout = min(args.timeout or left, left)
        sampler = Sampler(save)
        sampler.start()
        try:
            tool(runs[-1], work, samples, options, args, sampler)
        finally:
            sampler.stop()
        save()
    print("\n" + "\n".join(census.lines()) + "\n\n" + table(runs), flush=True)
    if args.kernelbench and "--no-timing" not in options:
        print("\n" + "\n".join(agreement(args, work, samples)), flush=True)
    return 0


def agreement(args: argparse.Namespace, work: Path, samples: list[Sample]) -> list[str]:
    """Both tools' speedups side by side (bench/speedup_agreement.py)."""
    if str(Path(__file__).parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).parent))
    from speedup_agreement import kbench_figures, kernelbench_figures, report

    levels = {s.level for s in samples}
    level = levels.pop() if len(levels) == 1 else 9
    run = work / "kernelbench" / f"runs/rb_level{level}"
    files = [args.out.resolve() / "results.json", run / "eval_results.json",
             run / "samples.json"]
    if not all(f.exists() for f in files):
        return [f"speedups not compared: {', '.join(str(f) for f in files if not f.exists())} "
                "missing"]
    mine = kbench_figures(json.loads(files[0].read_text()), work / "subs")
    baseline = json.loads(args.kb_baseline.read_text()) if args.kb_baseline else None
    theirs, missing = kernelbench_figures(
        json.loads(files[1].read_text()), json.loads(files[2].read_text()), level,
        {str(pid): f"{s.problem}.py" for pid, s in enumerate(samples, 1)}, baseline)
    return report(mine, theirs) + ([f"KernelBench gave no reference time for {len(missing)} "
                                    "correct sample(s) (pass --kb-baseline)"] if missing else [])


if __name__ == "__main__":
    sys.exit(main())
