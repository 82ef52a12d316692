"""What is fixed for one grading run on one device: the task, the options, the reference the
trusted side computes expected outputs with, the planned cases and the toolchain."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from kbench.cases import Case, plan_cases, select
from kbench.discovery import Submission
from kbench.grading.options import Options
from kbench.protocol import TimingSettings
from kbench.task import Params, Task
from kbench.toolchain import Toolchain, find_toolchain

Say = Callable[[str], None]


@dataclass
class Context:
    task: Task
    options: Options
    device: torch.device
    reference: ModuleType  # the task's reference module: Model, make_inputs, min_bytes
    init_args: list
    ref_model: torch.nn.Module  # the trusted side's own instance, for expected outputs
    toolchain: Toolchain
    cases: list[Case]
    logs: Path
    reference_file: Submission  # the reference module as a worker loads it
    say: Say

    @classmethod
    def create(cls, task: Task, options: Options, say: Say = lambda line: None) -> Context:
        """Raises kbench.cases.CaseError for a ``--case`` the plan does not have."""
        device = torch.device(options.device.value)
        reference = task.reference_module()
        init_args = list(reference.get_init_inputs())
        return cls(
            task=task, options=options, device=device, reference=reference,
            init_args=init_args, ref_model=reference.Model(*init_args).to(device).eval(),
            toolchain=find_toolchain(options.cuda_arch, options.cache_dir / "toolkits"),
            cases=select(plan_cases(task, options.seed), options.case_indices),
            logs=options.out_dir / "logs",
            reference_file=Submission("reference", Path(reference.__file__)), say=say)

    @property
    def benchmarks(self) -> tuple[Params, ...]:
        return self.task.benchmarks[self.device.type]

    def traffic(self, params: Params) -> int:
        """Bytes one timed call must move at least, as the task computes them."""
        return self.task.min_bytes(params, self.task.benchmark_dtype)

    def timing(self, rounds: int) -> TimingSettings:
        """The task's stopwatch settings for one of ``rounds`` turns."""
        t = self.task.timing[self.device.type]
        return TimingSettings(warmup_ms=t.warmup_ms, min_samples=math.ceil(t.min_samples / rounds),
                              max_samples=math.ceil(t.max_samples / rounds),
                              budget_ms=t.budget_ms / rounds, target_ci=t.target_ci,
                              mode=self.options.timing.value)

    def failure(self, sub: Submission, case: Case) -> dict:
        """The failing case and the command that reproduces it."""
        return {"case": case.to_dict(),
                "reproduce": f"kbench grade {sub.path} --seed {self.options.seed} "
                             f"--case {case.index} --device {self.device.type}"}
