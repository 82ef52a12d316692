"""Correctness cases: the task's fixed edge shapes plus fresh random shapes each run.

A run seed decides everything (shapes, dtypes, distributions, per-case value seeds), so a failure
reported as "seed S, case K" is reproduced exactly by ``kbench grade --seed S --case K``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kbench.results import params_text
from kbench.task import Params, Task


@dataclass(frozen=True)
class Case:
    index: int
    params: Params
    dtype: str
    distribution: str
    seed: int

    def describe(self) -> str:
        return (f"case {self.index} ({params_text(self.params)} {self.dtype} {self.distribution}, "
                f"seed {self.seed})")

    def to_dict(self) -> dict:
        return {"index": self.index, "params": dict(self.params), "dtype": self.dtype,
                "distribution": self.distribution, "seed": self.seed}


def plan_cases(task: Task, run_seed: int) -> list[Case]:
    """Fixed shapes first, then random ones; float32 (the task's first dtype) before the rest."""
    spec = task.correctness
    rng = random.Random(run_seed)
    drafts = []
    for i, params in enumerate(spec.fixed_shapes):
        drafts.append((dict(params), task.dtypes[0],
                       spec.distributions[i % len(spec.distributions)]))
    for i in range(spec.random_cases):
        sizes = _random_shape(rng, spec.random_shape, spec.max_elements)
        dtype = task.dtypes[i % len(task.dtypes)]
        drafts.append((dict(zip(task.parameters, sizes, strict=True)), dtype,
                       spec.distributions[i % len(spec.distributions)]))
    drafts.sort(key=lambda d: task.dtypes.index(d[1]))  # stable: keeps fixed shapes first
    return [Case(index=i, params=params, dtype=dtype, distribution=dist,
                 seed=rng.getrandbits(62))
            for i, (params, dtype, dist) in enumerate(drafts)]


def _random_shape(rng: random.Random, ranges: tuple[tuple[int, int], ...],
                  max_elements: int) -> tuple[int, ...]:
    dims = [_log_uniform_int(rng, lo, hi) for lo, hi in ranges]
    for i in range(len(dims)):  # shrink leading dimensions first to respect the size bound
        rest = math.prod(dims[:i] + dims[i + 1:])
        dims[i] = max(1, min(dims[i], max_elements // max(rest, 1)))
    return tuple(dims)


def _log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    value = int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))
    return min(max(value, lo), hi)


class CaseError(ValueError):
    """``--case`` names a case the plan does not have."""


def select(cases: list[Case], indices: list[int] | None) -> list[Case]:
    """The cases named by ``--case``; raises CaseError for an index the plan does not have."""
    if not indices:
        return cases
    missing = [i for i in indices if not 0 <= i < len(cases)]
    if missing:
        raise CaseError(f"--case {missing[0]}: this run has cases 0..{len(cases) - 1}")
    return [cases[i] for i in sorted(set(indices))]
