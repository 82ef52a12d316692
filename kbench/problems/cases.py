"""Correctness cases: the task's fixed edge shapes plus fresh random shapes each run.

A run seed decides everything (shapes, dtypes, distributions, per-case value seeds), so a failure
reported as "seed S, case K" is reproduced exactly by ``kbench grade --seed S --case K``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kbench.problems.task import Params, Task
from kbench.results.run_record import params_text


@dataclass(frozen=True)
class Case:
    index: int
    params: Params
    dtype: str
    distribution: str
    seed: int
    # Screening (kbench.grading.checking.screen) tightens a case's tolerance by this factor where an
    # output a lazy kernel could return passes it.
    scale: float = 1.0

    def describe(self) -> str:
        return (f"case {self.index} ({params_text(self.params)} {self.dtype} {self.distribution}, "
                f"seed {self.seed})")

    def to_dict(self) -> dict:
        return {"index": self.index, "params": dict(self.params), "dtype": self.dtype,
                "distribution": self.distribution, "seed": self.seed, "scale": self.scale}


# Draws per random case before it is given up, where the task checks sizes (task.valid).
_TRIES = 8


def plan_cases(task: Task, run_seed: int, device: str = "cuda") -> list[Case]:
    """Fixed shapes first, then random ones; float32 (the task's first dtype) before the rest.
    A random draw the reference cannot run (where the task checks) is drawn again, then
    varied in one size only, then left out."""
    spec = task.correctness_on(device)
    rng = random.Random(run_seed)
    drafts = []
    for i, params in enumerate(spec.fixed_shapes):
        drafts.append((dict(params), task.dtypes[0],
                       spec.distributions[i % len(spec.distributions)]))
    steps = spec.steps or (1,) * len(task.parameters)
    base = dict(spec.fixed_shapes[0]) if spec.fixed_shapes else None
    for i in range(spec.random_cases):
        params = _random_params(rng, task, spec.random_shape, steps, spec.max_elements, base)
        if params is not None:
            drafts.append((params, task.dtypes[i % len(task.dtypes)],
                           spec.distributions[i % len(spec.distributions)]))
    drafts.sort(key=lambda d: task.dtypes.index(d[1]))  # stable: keeps fixed shapes first
    return [Case(index=i, params=params, dtype=dtype, distribution=dist,
                 seed=rng.getrandbits(62))
            for i, (params, dtype, dist) in enumerate(drafts)]


def _random_params(rng: random.Random, task: Task, ranges: tuple[tuple[int, int], ...],
                   steps: tuple[int, ...], max_elements: int, base: Params | None
                   ) -> Params | None:
    for attempt in range(2 * _TRIES):
        dims = _random_shape(rng, ranges, steps, max_elements)
        params = dict(zip(task.parameters, dims, strict=True))
        if attempt >= _TRIES and base is not None:  # one size varied, the rest as fixed
            varying = [n for n, (lo, hi) in zip(task.parameters, ranges, strict=True) if lo < hi]
            if not varying:
                return None
            name = rng.choice(varying)
            params = {**base, name: params[name]}
        if task.valid(params):
            return params
    return None


def _random_shape(rng: random.Random, ranges: tuple[tuple[int, int], ...],
                  steps: tuple[int, ...], max_elements: int) -> tuple[int, ...]:
    dims = [max(lo, _log_uniform_int(rng, lo, hi) // step * step) if lo < hi else lo
            for (lo, hi), step in zip(ranges, steps, strict=True)]
    for i, (lo, hi) in enumerate(ranges):  # shrink leading varying sizes first to the bound
        if lo < hi:
            rest = math.prod(dims[:i] + dims[i + 1:])
            dims[i] = max(lo, min(dims[i], max_elements // max(rest, 1)))
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
