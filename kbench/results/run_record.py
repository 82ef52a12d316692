"""The record of a grading run: what each report is rendered from, and results.json's schema."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from kbench.results.modes import DEFAULT_PROFILE, DEFAULT_RULES, DEFAULT_TIMING, TimingMode
from kbench.results.verdict import Status

LAUNCH_BOUND_MS = 0.05  # below this, an eager figure is mostly launch overhead


def params_text(params: dict[str, int]) -> str:
    """A case's sizes as reports write them, in the task's parameter order: 4096x4096."""
    return "x".join(str(v) for v in params.values())


def error_line(exc: BaseException) -> str:
    """An exception as one line of a report: its type and its message's first line."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text \
        else type(exc).__name__


@dataclass
class Measurement:
    """One side's timing of one shape: the median in ms with its 95 % interval ([low, high]),
    achieved GB/s (the task's minimum traffic over the median), and what the clock saw."""

    ms: float
    ci: list[float]
    samples: int
    gbps: float | None = None
    side_work_ms: float | None = None  # work left on other streams per call, charged (median)
    host_ms: float | None = None  # median host time to issue one call (not in ``ms`` on CUDA)
    fastest_ms: float | None = None  # the fastest sample (kbench's clock checks it on a CPU)
    sm_mhz: float | None = None  # median SM clock over the samples (NVML), None where unread
    mem_mhz: float | None = None
    max_sm_mhz: int | None = None
    slowed: int = 0  # samples read while NVML reported a slowdown (power, thermal)
    l2_reset: bool = True  # persisting L2 lines were reset before every sample (CUDA)
    exclusive_hold: bool | None = None  # CUDA: the hold filled every SM (kbench.worker.hold)
    # per call on kbench's own clock (kbench.grading.timing.integrity)
    trusted_ms: float | None = None


@dataclass
class Benchmark:
    """One benchmark shape. In a run's reference list: the eager reference at the start and
    end of the run and both pooled, and torch.compile of it. In a submission's list: the
    submission's timing, the eager reference's timing in rounds alternating with it, and the
    speedups over that and over torch.compile. ``skipped`` says why a shape was not timed;
    ``drift`` why the start and end references disagree."""

    params: dict[str, int]  # the case's sizes by name (kbench.problems.task.Params)
    dtype: str
    reference: Measurement | None = None
    reference_start: Measurement | None = None
    reference_end: Measurement | None = None
    compiled: Measurement | None = None
    drift: str | None = None
    candidate: Measurement | None = None
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    compile_speedup: float | None = None
    compile_speedup_ci: list[float] | None = None
    skipped: str | None = None
    flops: int | None = None  # matrix-unit FLOPs of one call, counted on the reference
    nbytes: int | None = None  # the fewest bytes one call must move
    # Timed as KernelBench's evaluator times (kbench.grading.timing.kernelbench_timing): the mean
    # of its trials, the submission's and the reference's, and their ratio; the submission's
    # trials (KernelBench's 100, fewer where the profile budgets them).
    kernelbench_ms: float | None = None
    kernelbench_reference_ms: float | None = None
    kernelbench_speedup: float | None = None
    kernelbench_trials: int | None = None

    @classmethod
    def from_dict(cls, data: dict) -> Benchmark:
        sides = ("reference", "reference_start", "reference_end", "compiled", "candidate")
        data = dict(data)
        if "shape" in data:  # stored before kbench 0.3: sizes without names
            data["params"] = {f"d{i}": v for i, v in enumerate(data.pop("shape"))}
        return cls(**{k: Measurement(**v) if k in sides and v else v for k, v in data.items()})


@dataclass
class TimedBeside:
    """What else ran on the host while a submission was timed (kbench.grading.timing.disturbance):
    the host's load, the run's other builds and timings that overlapped, whether that
    disturbed the timing, and what was done about a flag raised meanwhile."""

    seconds: float  # wall seconds of its timing
    other_busy_cores: float  # cores other processes kept busy on average (kbench.host.load)
    load_avg: float | None  # the host's 1-minute load average at the end
    cores: int
    beside: list[str] = field(default_factory=list)  # builds and timings that overlapped
    disturbed: bool = False
    # Why it was timed again alone at the end: the flag its first timing raised while the
    # host was disturbed ("" where it was not).
    retimed_alone: str = ""
    # "timing disturbed: ..." where kbench's clock could not tell, the host staying busy
    notes: list[str] = field(default_factory=list)

    def said(self) -> list[str]:
        """What ran beside the timing, in the words the reports use."""
        said = [f"{self.other_busy_cores:g} of {self.cores} cores busy with other work"
                + (f", load average {self.load_avg:.2f}" if self.load_avg is not None else "")]
        said += [f"beside: {', '.join(self.beside)}"] if self.beside else []
        said += [f"timed again alone after: {self.retimed_alone}"] if self.retimed_alone else []
        return said + self.notes


@dataclass
class RuleVerdict:
    """A verdict under one set of correctness rules (kbench.grading.checking.kernelbench_rules)."""

    status: Status
    reason: str = ""
    passed: int = 0  # trials passed (KernelBench's rules run five)

    @classmethod
    def from_dict(cls, data: dict) -> RuleVerdict:
        return cls(Status(data["status"]), data.get("reason", ""), data.get("passed", 0))


@dataclass
class SubmissionResult:
    name: str
    path: str
    sha256: str
    status: Status
    reason: str = ""
    speedup: float | None = None  # over eager reference: geometric mean over timed shapes
    speedup_ci: list[float] | None = None  # geometric means of the shapes' interval bounds
    compile_speedup: float | None = None  # the same over torch.compile of the reference
    compile_speedup_ci: list[float] | None = None
    cases_passed: int = 0
    cases_total: int = 0
    failure: dict | None = None  # the failing case and how to reproduce it
    benchmarks: list[Benchmark] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    build_s: float | None = None
    logs: list[str] = field(default_factory=list)
    reused_from_run: int | None = None  # copied from that run: same file, task and software
    problem: str = ""  # the task's name: l2norm, level1/19_ReLU
    backend: str = ""  # the kernel language that claimed it (kbench.host.backends): cuda, triton...
    # Of a profiled call's GPU time at the timed sizes, the share in the submission's own
    # kernels, and the longest-running kernels (kbench.grading.checking.custom_kernels); CUDA only.
    custom_share: float | None = None
    kernels: list[str] = field(default_factory=list)
    # Wall seconds of each stage it reached in its grading process (load, correctness, timing,
    # kernels): where a slot's time goes (bench/throughput.py sums them).
    stage_s: dict[str, float] = field(default_factory=dict)
    # The verdict under KernelBench's rules, for a KernelBench problem file (None for a task
    # of kbench's own format); ``status`` is the verdict under the run's ranking rules.
    kernelbench: RuleVerdict | None = None
    timed_beside: TimedBeside | None = None  # what else ran on the host while it was timed
    # Its speedup as KernelBench's evaluator computes it (means, its warm-up and trials),
    # geometric mean over the timed cases; for KernelBench problem files.
    kernelbench_speedup: float | None = None
    # Seconds of its timing stage by part (rounds, reference, fresh, verify, clock,
    # kernelbench): what timing costs, and where (bench/real_batch.py sums them).
    timing_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        if self.kernelbench is not None:
            data["kernelbench"]["status"] = self.kernelbench.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> SubmissionResult:
        kb, beside = data.get("kernelbench"), data.get("timed_beside")
        return cls(**{**data, "status": Status(data["status"]), "benchmarks": [
            Benchmark.from_dict(b) for b in data.get("benchmarks", [])],
            "kernelbench": RuleVerdict.from_dict(kb) if kb else None,
            "timed_beside": TimedBeside(**beside) if beside else None})


@dataclass
class ProblemRun:
    """One problem in a run: what screening decided (notes) or why it cannot be graded
    (error), and its reference table. ``degenerate``: why its output tells kernels apart
    poorly (rounding noise, constant, independent of its inputs or weights); it is graded,
    and left out of fast_p and the geometric mean unless the run includes degenerate ones."""

    name: str
    path: str
    digest: str
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    reference: list[Benchmark] = field(default_factory=list)
    copy_gbps: float | None = None  # device-to-device copy, measured in the same run
    degenerate: str | None = None
    # Seconds of the problem's own stages on its device: screening, the reference's timing,
    # torch.compile of it, the drift check (a batch's cost beside its submissions').
    stage_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ProblemRun:
        data = dict(data)
        data["reference"] = [Benchmark.from_dict(b) for b in data.get("reference", [])]
        return cls(**data)


@dataclass
class RunResult:
    kbench_version: str
    task: str  # what was graded: a task's name, or the problem set's
    seed: int
    started: str
    environment: dict
    problems: list[ProblemRun]
    submissions: list[SubmissionResult]
    notes: list[str] = field(default_factory=list)
    run_id: int | None = None  # in the results store
    timing_mode: str = DEFAULT_TIMING.value  # or graph: CUDA-graph replays, no launch overhead
    profile: str = DEFAULT_PROFILE.value  # or quick: less timing evidence per figure
    rules: str = DEFAULT_RULES.value  # whose rules ``status`` follows (kbench.results.modes)
    include_degenerate: bool = False  # degenerate problems count in fast_p and the geomean

    @property
    def copy_gbps(self) -> float | None:
        """Device-to-device copy bandwidth measured in this run."""
        return next((p.copy_gbps for p in self.problems if p.copy_gbps), None)

    def problem(self, name: str) -> ProblemRun | None:
        return next((p for p in self.problems if p.name == name), None)

    def under_kernelbench(self) -> RunResult | None:
        """The run with each submission's verdict under KernelBench's rules, for summaries
        (None where no submission has one). Submissions that failed kbench's rules were not
        timed: under KernelBench's they may count as correct, never as fast."""
        if not any(s.kernelbench for s in self.submissions):
            return None
        return replace(self, submissions=[
            replace(s, status=s.kernelbench.status, reason=s.kernelbench.reason)
            if s.kernelbench else s for s in self.submissions])

    def launch_bound(self, problem: ProblemRun) -> set[str]:
        """The problem's sizes (as params_text) whose eager reference took under
        LAUNCH_BOUND_MS on a GPU: figures there are mostly launch overhead (the report marks
        them, `kbench compare` judges them with a wider noise floor)."""
        if self.timing_mode != TimingMode.EAGER or self.environment.get("device") != "cuda":
            return set()
        return {params_text(b.params) for b in problem.reference
                if b.reference is not None and b.reference.ms < LAUNCH_BOUND_MS}

    @classmethod
    def from_dict(cls, data: dict) -> RunResult:
        """A run as results.json holds it (from ``to_dict``; one written before kbench 0.3
        has a single problem's reference and notes at the top)."""
        problems = [ProblemRun.from_dict(p) for p in data.get("problems", [])] or [
            ProblemRun(data["task"], "", "", notes=list(data.get("notes", [])),
                       reference=[Benchmark.from_dict(b) for b in data.get("reference", [])],
                       copy_gbps=data.get("copy_gbps"))]
        only = problems[0].name if len(problems) == 1 else ""
        subs = [SubmissionResult.from_dict({"problem": only, **raw})
                for raw in data["submissions"]]
        own = {n for p in problems for n in p.notes}  # to_dict adds a single problem's
        notes = [n for n in data.get("notes", []) if n not in own]
        return cls(data["kbench_version"], data["task"], data["seed"], data["started"],
                   data["environment"], problems, subs, list(notes), data.get("run_id"),
                   data.get("timing_mode", DEFAULT_TIMING.value),
                   data.get("profile", DEFAULT_PROFILE.value),
                   data.get("rules", DEFAULT_RULES.value),
                   data.get("include_degenerate", False))

    def to_dict(self) -> dict:
        single = self.problems[0] if len(self.problems) == 1 else None
        return {
            "kbench_version": self.kbench_version,
            "run_id": self.run_id,
            "task": self.task,
            "seed": self.seed,
            "started": self.started,
            "environment": self.environment,
            "copy_gbps": self.copy_gbps,
            "timing_mode": self.timing_mode,
            "profile": self.profile,
            "rules": self.rules,
            "include_degenerate": self.include_degenerate,
            "notes": self.notes + (single.notes if single else []),
            "reference": [asdict(b) for b in single.reference] if single else [],
            "problems": [p.to_dict() for p in self.problems],
            "submissions": [s.to_dict() for s in self.submissions],
        }


def ms_text(m: Measurement | None) -> str:
    return f"{m.ms:.4g} ms" if m is not None else "-"
