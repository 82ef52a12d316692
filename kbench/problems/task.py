"""Tasks: what a submission is graded against, as typed settings.

A task is a KernelBench problem file as it is (``Model``, ``get_inputs``, ``get_init_inputs``,
module-level sizes), with defaults for everything else (kbench.problems.defaults), or a YAML
file (kbench.problems.task_yaml) that names a reference, a problem file or a module of kbench's own
with ``make_inputs``, and says what the file cannot: tolerances, sizes, dtypes, mode. Every
error names the file, the key and what is allowed.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from kbench.host import paths
from kbench.shared import inputs

if TYPE_CHECKING:
    from kbench.problems.trial import Work

DTYPES = ("float32", "float16", "bfloat16", "float64")

# One case's sizes by name, in the task's ``parameters`` order: {"batch": 16, "dim": 16384}.
Params = dict[str, int]
DEVICES = ("cpu", "cuda")


class TaskError(Exception):
    """A task file is missing, malformed, or names something that does not exist."""


@dataclass(frozen=True)
class Tolerance:
    """Per element: |out - ref| <= atol * rms(ref) + rtol * |ref|.

    atol is relative to the reference output's root-mean-square, so it shrinks with the
    output's magnitude instead of swallowing small outputs whole.
    """

    rtol: float
    atol: float

    def scaled(self, factor: float) -> Tolerance:
        return Tolerance(rtol=self.rtol * factor, atol=self.atol * factor)


@dataclass(frozen=True)
class Correctness:
    distributions: tuple[str, ...]
    fixed_shapes: tuple[Params, ...]
    random_cases: int
    random_shape: tuple[tuple[int, int], ...]  # inclusive [lo, hi] per parameter, log-uniform
    max_elements: int
    steps: tuple[int, ...] = ()  # per parameter: drawn values are multiples of it (default 1)


@dataclass(frozen=True)
class Timing:
    warmup_ms: float
    min_samples: int
    max_samples: int
    budget_ms: float  # per benchmark shape and side
    target_ci: float  # stop once the median's 95 % interval is this close (relative half-width)
    compile_reference: bool  # also time torch.compile of the reference, a second baseline
    # Shapes whose reference runs under this at the start take each round, on each side, in a
    # process of its own: a process's launch path sets its own level
    # (kbench.grading.timing.alternating).
    fresh_rounds_below_ms: float

    def stopwatch(self) -> dict:
        """The settings of kbench.worker.timing.measure for one whole measurement."""
        return {"warmup_ms": self.warmup_ms, "min_samples": self.min_samples,
                "max_samples": self.max_samples, "budget_ms": self.budget_ms,
                "target_ci": self.target_ci}


@dataclass(frozen=True)
class Limits:
    build_s: float
    load_s: float
    case_s: float
    benchmark_s: float
    host_memory_gib: float
    log_mib: float


_modules: dict[Path, ModuleType] = {}


@dataclass(frozen=True)
class Task:
    name: str  # as reports show it: l2norm, level1/19_ReLU
    path: Path  # the task file: a YAML or the problem file itself
    reference: str  # an importable module or a Python file (Model, get_inputs, ...)
    semantics: str
    parameters: tuple[str, ...]  # what a case's sizes are called, in order
    dtypes: tuple[str, ...]
    tolerance: dict[str, Tolerance]
    correctness: Correctness  # at the task's own sizes (on CUDA)
    benchmark_dtype: str
    benchmarks: dict[str, tuple[Params, ...]]  # device -> cases
    timing: dict[str, Timing]  # device -> settings
    limits: Limits
    digest: str  # sha256 of the task file and its reference: a changed task re-grades
    mode: str = "train"  # or "eval": models stay as constructed unless the task says eval
    # The tolerances are kbench's defaults, not the task's word: screening may widen them
    # where the reference's own float arithmetic needs it (kbench.grading.checking.screen).
    default_tolerance: bool = False
    cpu_correctness: Correctness | None = None  # shrunk for a CPU run; None: as on CUDA
    checked_sizes: bool = False  # random sizes are tried on the meta device before use
    notes: tuple[str, ...] = ()  # what kbench decided about the problem's sizes

    @property
    def reference_path(self) -> Path:
        """The reference's file: what workers load."""
        if self.reference.endswith(".py"):
            return Path(self.reference).resolve()
        return Path(importlib.import_module(self.reference).__file__).resolve()

    def reference_module(self) -> ModuleType:
        """The reference, imported once per process by its file (workers load the same file,
        kbench.shared.inputs.load_file)."""
        path = self.reference_path
        if path not in _modules:
            _modules[path] = inputs.load_file(path, f"kbench_task_{_tag(path)}")
        return _modules[path]

    @property
    def problem_inputs(self) -> bool:
        """Inputs come from the problem's get_inputs (kbench.shared.inputs.PROBLEM)."""
        return self.correctness.distributions == (inputs.PROBLEM,)

    def correctness_on(self, device: str) -> Correctness:
        return self.cpu_correctness if device == "cpu" and self.cpu_correctness else \
            self.correctness

    def valid(self, params: Params) -> bool:
        """Can the reference run at these sizes (checked on the meta device where the task's
        sizes were; else assumed, and screening drops a case that breaks it)?"""
        if not self.checked_sizes:
            return True
        from kbench.problems.sizes import valid
        return valid(self.reference_module(), params, self.mode == "eval")

    def min_bytes(self, params: Params, dtype: str) -> int:
        """Bytes one call must move at least (for GB/s and the copy-bandwidth bound): the
        reference module's ``min_bytes`` where it has one, else counted on the meta device
        (kbench.problems.trial: what it writes, and of what it reads, what it must)."""
        module = self.reference_module()
        if hasattr(module, "min_bytes"):
            return int(module.min_bytes(params, dtype))
        work = self._work(params, dtype)
        return work.moved if work else 0

    def held_bytes(self, params: Params, dtype: str) -> int:
        """Bytes one call's inputs, parameters and outputs hold (for the memory plan): the
        module's ``min_bytes`` where it has one, else counted."""
        module = self.reference_module()
        if hasattr(module, "min_bytes"):
            return int(module.min_bytes(params, dtype))
        work = self._work(params, dtype)
        return work.bytes if work else 0

    def flops(self, params: Params, dtype: str) -> int | None:
        """Matrix-unit FLOPs of one call, as torch.utils.flop_counter counts them on the
        meta device; None where they cannot be counted (or the task declares bytes only)."""
        if hasattr(self.reference_module(), "min_bytes"):
            return None
        work = self._work(params, dtype)
        return work.flops if work else None

    def _work(self, params: Params, dtype: str) -> Work | None:
        from kbench.problems.trial import TrialError, on_meta
        try:
            return on_meta(self.reference_module(), params, dtype, self.mode == "eval")
        except TrialError:
            return None

    def renamed(self, name: str) -> Task:
        return replace(self, name=name)


def _tag(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:12]


def digest(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def find_task(name_or_path: str) -> Path:
    """A task by name (tasks/NAME.yaml or tasks/NAME.py) or by path to a YAML or problem
    file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml", ".py"):
        if not candidate.is_file():
            raise TaskError(f"{candidate}: task file not found")
        return candidate
    for suffix in (".yaml", ".py"):
        path = paths.tasks_dir() / f"{name_or_path}{suffix}"
        if path.is_file():
            return path
    known = ", ".join(available_tasks()) or "none"
    raise TaskError(f"no task named {name_or_path!r} in {paths.tasks_dir()} (known: {known})")


def available_tasks() -> list[str]:
    """Tasks in tasks/: each YAML, and each problem file no YAML there names."""
    directory = paths.tasks_dir()
    if not directory.is_dir():
        return []
    return sorted({p.stem for p in directory.glob("*.yaml")}
                  | {p.stem for p in directory.glob("*.py") if not p.name.startswith("_")})
