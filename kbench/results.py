"""The record of a grading run: what each report is rendered from, and results.json's schema."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kbench.verdict import Status


@dataclass
class Benchmark:
    """One benchmark shape. Times are medians in milliseconds, each with its 95 % interval
    ([low, high]); GB/s count the task's minimum traffic; ``skipped`` says why a shape was not
    timed."""

    shape: list[int]
    dtype: str
    ref_ms: float | None = None
    ref_ci: list[float] | None = None
    ref_samples: int = 0
    ref_gbps: float | None = None
    ms: float | None = None
    ci: list[float] | None = None
    samples: int = 0
    gbps: float | None = None
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    skipped: str | None = None


@dataclass
class SubmissionResult:
    name: str
    path: str
    sha256: str
    status: Status
    reason: str = ""
    speedup: float | None = None  # geometric mean over timed shapes
    speedup_ci: list[float] | None = None  # geometric means of the shapes' interval bounds
    cases_passed: int = 0
    cases_total: int = 0
    failure: dict | None = None  # the failing case and how to reproduce it
    benchmarks: list[Benchmark] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    build_s: float | None = None
    logs: list[str] = field(default_factory=list)
    reused_from_run: int | None = None  # copied from that run: same file, task and software

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        return data


@dataclass
class RunResult:
    kbench_version: str
    task: str
    seed: int
    started: str
    environment: dict
    reference: list[Benchmark]
    submissions: list[SubmissionResult]
    notes: list[str] = field(default_factory=list)
    run_id: int | None = None  # in the results store
    copy_gbps: float | None = None  # device-to-device copy, measured in the same run

    def to_dict(self) -> dict:
        return {
            "kbench_version": self.kbench_version,
            "run_id": self.run_id,
            "task": self.task,
            "seed": self.seed,
            "started": self.started,
            "environment": self.environment,
            "copy_gbps": self.copy_gbps,
            "notes": self.notes,
            "reference": [asdict(b) for b in self.reference],
            "submissions": [s.to_dict() for s in self.submissions],
        }
