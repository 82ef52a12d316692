"""What is fixed for one problem graded on one device: the task, the options, the reference
the trusted side computes expected outputs with, the planned cases and the toolchain."""

from __future__ import annotations

import copy
import hashlib
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kbench.grading.options import Options
from kbench.host.toolchain import Toolchain
from kbench.problems.cases import Case, plan_cases, select
from kbench.problems.discovery import Submission
from kbench.problems.task import Params, Task, Tolerance
from kbench.shared import inputs
from kbench.shared.outputs import flatten
from kbench.shared.protocol import ModelSpec, TimingSettings, Warm

Say = Callable[[str], None]

_MODELS_KEPT = 2  # reference instances kept (cases of other sizes or dtypes build their own)
# A case's warm-up in a process that has timed it before: its code is loaded and its allocator
# holds the case's blocks, and the other side's round just before kept the device's clocks up.
# The first untimed call still comes first. A full warm-up every round was 5.6 s of an l2norm
# submission's timing under the full profile (56 rounds of 100 ms).
_AGAIN_WARMUP = 0.1


class NoExact(Exception):
    """The reference ran in the case's dtype but not as its float64 copy
    (kbench.grading.checking.screen then takes exact values from float32)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class Expected:
    """The reference's output for one input, as leaves: ``output`` in the case's dtype (the
    type, shape and dtype to match; integer values to match exactly) and ``exact`` from a
    float64 copy of the model on float64 inputs (the values to approach)."""

    output: list
    structure: str
    exact: list


@dataclass(frozen=True)
class Spare:
    """Cores that kbench's own work may use beside a timing without touching the timing's
    cores (a one-GPU run's build cores), at a build's priority: a worker readied, a model
    compiled, ahead of its turn (kbench.grading.channel.Ahead)."""

    cpus: tuple[int, ...]
    nice: int


@dataclass
class Context:
    task: Task
    options: Options
    device: torch.device
    reference: ModuleType | None  # the task's reference module (None: for building only)
    toolchain: Toolchain
    cases: list[Case]
    logs: Path
    reference_file: Submission  # the reference's file as a worker loads it
    say: Say
    model_seed: int  # every model instance of the run is built under it (same weights)
    notes: list[str] = field(default_factory=list)  # what screening found or decided
    # Why the problem's output tells kernels apart poorly (kbench.grading.checking.screen); graded
    # all the same, and left out of fast_p and the geometric mean unless --include-degenerate.
    degenerate: list[str] = field(default_factory=list)
    exact_dtype: str = "float64"  # "float32" where an op of the reference has no float64
    _models: dict[str, Any] = field(default_factory=dict, repr=False)
    # KernelBench's trials' inputs as drawn on the CPU, by seed, for the problem's next
    # submission (kbench.grading.checking.kernelbench_rules)
    trial_inputs: dict[int, list] = field(default_factory=dict, repr=False)
    spare: Spare | None = None  # where work ahead of its turn may run; None: it waits its turn

    @classmethod
    def create(cls, task: Task, options: Options, toolchain: Toolchain,
               say: Say = lambda line: None) -> Context:
        """Raises kbench.problems.cases.CaseError for a ``--case`` the plan does not have."""
        device = torch.device(options.device.value)
        seed = int.from_bytes(hashlib.sha256(f"{options.seed}:weights".encode()).digest()[:6],
                              "big")
        return cls(
            task=task, options=options, device=device, reference=task.reference_module(),
            toolchain=toolchain,
            cases=select(plan_cases(task, options.seed, device.type), options.case_indices),
            logs=options.out_dir / "logs",
            reference_file=Submission("reference", task.reference_path), say=say,
            model_seed=seed, notes=list(task.notes))

    @classmethod
    def for_building(cls, task: Task, options: Options, toolchain: Toolchain) -> Context:
        """What a build needs (limits, logs, toolchain, device): no reference module and no
        cases, so a build thread never touches the module a grader binds sizes into."""
        return cls(task=task, options=options, device=torch.device(options.device.value),
                   reference=None, toolchain=toolchain, cases=[],
                   logs=options.out_dir / "logs",
                   reference_file=Submission("reference", task.reference_path),
                   say=lambda line: None, model_seed=0)

    @property
    def benchmarks(self) -> tuple[Params, ...]:
        return self.task.benchmarks[self.device.type]

    @property
    def distribution(self) -> str:
        """What timed inputs are drawn from: the task's first distribution."""
        return self.task.correctness.distributions[0]

    def traffic(self, params: Params) -> int:
        """Bytes one timed call must move at least, as the task computes them."""
        return self.task.min_bytes(params, self.task.benchmark_dtype)

    def load_spec(self) -> ModelSpec:
        """The instance a worker builds as it loads: the first case's (the problem's own
        sizes, unless --case picked others)."""
        params = self.cases[0].params if self.cases else self.benchmarks[0]
        return self.spec(params, self.cases[0].dtype if self.cases else self.task.dtypes[0])

    def tolerance(self, case: Case) -> Tolerance:
        return self.task.tolerance[case.dtype].scaled(case.scale)

    def spec(self, params: Params, dtype: str) -> ModelSpec:
        """The model instance for a case: the problem's init inputs at its sizes."""
        init = inputs.init_inputs(self.reference, params, self.model_seed)
        return ModelSpec(init_args=init, dtype=dtype, seed=self.model_seed, params=dict(params))

    def draw(self, params: Params, dtype: str, distribution: str, seed: int) -> list:
        return inputs.draw(self.reference, params, dtype, distribution, seed, self.device)

    def expected(self, params: Params, dtype: str, args: list, exact: bool = True) -> Expected:
        """The reference's output on ``args`` (drawn at ``params``), in ``dtype`` and (unless
        not ``exact``) from its float64 copy."""
        spec = self.spec(params, dtype)
        output, structure = self.reference_output(spec, args)
        if self.exact_dtype == dtype or not exact:
            return Expected(output, structure, output)
        try:
            with torch.no_grad():
                exact_model = self._model(spec, exact=True)
                exact, _ = flatten(exact_model(*inputs.promoted(args, self.exact_dtype)))
        except Exception as exc:  # an op without float64, or no room for a float64 copy
            raise NoExact(exc) from exc
        return Expected(output, structure, exact)

    def reference_output(self, spec: ModelSpec, args: list) -> tuple[list, str]:
        """The reference instance ``spec`` names, run on ``args`` in its dtype: the output's
        leaves and structure (kbench.shared.outputs.flatten)."""
        model = self._model(spec)
        inputs.bind(self.reference, spec.params)  # a forward may read the module's sizes
        with torch.no_grad():
            return flatten(model(*args))

    def reference_state(self, spec: ModelSpec) -> dict[str, Any]:
        """A new reference instance's parameters and buffers by name, as built: before any
        call (a training-mode BatchNorm's forward updates its running statistics)."""
        return inputs.build(self.reference.Model, spec.init_args, spec.seed, self.device,
                            spec.dtype, self.task.mode == "eval").state_dict()

    def model(self, spec: ModelSpec) -> Any:
        """The reference instance ``spec`` names, as expected outputs come from."""
        return self._model(spec)

    def _model(self, spec: ModelSpec, exact: bool = False) -> Any:
        """The reference instance ``spec`` names (built under its seed), or its copy in the
        exact dtype; the latest few are kept."""
        key = repr((spec, exact))
        if key not in self._models:
            while len(self._models) >= 2 * _MODELS_KEPT:
                del self._models[next(iter(self._models))]
            self._models[key] = copy.deepcopy(self._model(spec)).to(
                dtype=getattr(torch, self.exact_dtype)) if exact else inputs.build(
                self.reference.Model, spec.init_args, spec.seed, self.device, spec.dtype,
                self.task.mode == "eval")
        return self._models[key]

    def release(self) -> None:
        """Device memory this process's caching allocator holds unused, given back: the
        worker, at a problem's own sizes, may need most of the device (its float64 copies
        here take twice an output's bytes, and the allocator keeps them reserved)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def forget(self) -> None:
        """What it holds for the problem's submissions given back (reference instances,
        KernelBench's trial draws, the allocator's cache): a closed problem stays held for
        a submission graded later, which makes them again."""
        self._models.clear()
        self.trial_inputs.clear()
        self.release()

    def without_float64(self) -> None:
        """The reference cannot run in float64 here: its exact outputs come from float32."""
        self.exact_dtype = "float32"
        self._models.clear()

    def timing(self, rounds: int, again: bool = False) -> TimingSettings:
        """The task's stopwatch settings for one of ``rounds`` turns, under the profile;
        ``again``: the process has timed this case before (see _AGAIN_WARMUP). A turn takes
        its share of the samples and the time, and stops once its own interval is within
        the target times the square root of ``rounds``: the median over all turns' samples,
        which the figure is, then has about the target's (each turn held to the whole
        target, the launch-bound sizes' eight turns a side took their whole budget)."""
        t, rigour = self.task.timing[self.device.type], self.options.rigour
        share = rigour.share / rounds
        return TimingSettings(warmup_ms=t.warmup_ms * (_AGAIN_WARMUP if again else 1.0),
                              min_samples=math.ceil(t.min_samples * share),
                              max_samples=math.ceil(t.max_samples * share),
                              budget_ms=t.budget_ms * share,
                              target_ci=t.target_ci * rigour.target_ci * math.sqrt(rounds),
                              mode=self.options.timing.value)

    def warm_request(self, params: Params) -> Warm:
        """A case's first-round warm-up to be done ahead (Channel.warm): here, on this thread,
        since a model's spec binds the problem's sizes."""
        dtype = self.task.benchmark_dtype
        return Warm(params=params, dtype=dtype, distribution=self.distribution,
                    model=self.spec(params, dtype), repeat_ms=self.timing(1).warmup_ms)

    def failure(self, sub: Submission, case: Case) -> dict:
        """The failing case and the command that reproduces it: its task and its run's output
        folder named (a command run from elsewhere, or for another folder, finds the same
        task and writes beside the run it repeats)."""
        command = ["kbench", "grade", str(sub.path), "--task", str(self.task.path), "--seed",
                   str(self.options.seed), "--case", str(case.index), "--device",
                   self.device.type, "--out", str(self.options.out_dir)]
        return {"case": case.to_dict(), "reproduce": shlex.join(command)}
