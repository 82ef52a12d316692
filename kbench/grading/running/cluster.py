"""A Ray cluster: each unit (kbench.grading.running.units) a Ray task holding one GPU (or one CPU
for ``--device cpu``), graded there by a LocalExecutor, its events returned to this process, which
alone writes the store and the reports. Ray retries a task whose worker or node was lost
(from the start of its unit: nothing of a lost attempt reached the store); when retries run
out, the unit's jobs get infrastructure_error, which ``--resume`` grades again.

Every node needs kbench and its dependencies installed, and the submissions, problems and
output folder at the same paths (a shared file system, or the same checkout everywhere)."""

from __future__ import annotations

import os
from typing import Any

from kbench.grading.context import Say
from kbench.grading.jobs import Job, Sink
from kbench.grading.options import Device, Options, OptionsError
from kbench.grading.running import units
from kbench.grading.running.local import LocalExecutor

RETRIES = 2  # Ray's own retries of a task whose worker died, before infrastructure_error


def _ray() -> Any:
    # Ray would otherwise replace builtins.print in this process with its own.
    os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
    try:
        import ray
    except ImportError:
        raise OptionsError("--executor ray needs Ray: pip install -e '.[ray]'") from None
    return ray


def _grade(unit: dict) -> list[units.Event]:
    """On a Ray worker: one unit, its events in order."""
    events: list[units.Event] = []
    units.run(units.Unit.from_dict(unit), events.append)
    return events


def _describe(options: Options) -> dict:
    """On a Ray worker: the machine the units run on, as LocalExecutor records it."""
    executor = LocalExecutor(options, pin=False)
    env = executor.environment()
    env["environment_problem"] = executor.environment_problem
    return env


class RayExecutor:
    def __init__(self, options: Options, address: str | None, say: Say = lambda line: None,
                 cpu_slots: int | None = None) -> None:
        self.ray = _ray()
        self.options, self.say = options, say
        self.notes: list[str] = []  # what the run's reports say about the grading itself
        if not self.ray.is_initialized():
            local = address is None and not os.environ.get("RAY_ADDRESS")
            self.ray.init(address=address, num_cpus=cpu_slots if local else None,
                          log_to_driver=False, include_dashboard=False if local else None)
        gpu = options.device is Device.CUDA
        self.resources = {"num_gpus": 1, "num_cpus": 1} if gpu else {"num_cpus": 1}
        total = self.ray.cluster_resources().get("GPU" if gpu else "CPU", 0)
        if total < 1:
            raise OptionsError(f"--executor ray: the cluster has no {'GPU' if gpu else 'CPU'}")
        self.slots = int(total)
        self.environment_problem: str | None = None

    def watch_store(self, presence: object) -> None:
        """Workers hold their own presences where they grade."""

    def environment(self) -> dict:
        describe = self.ray.remote(_describe).options(**self.resources)
        env = self.ray.get(describe.remote(self.options))
        self.environment_problem = env.pop("environment_problem")
        env["slots"] = [f"ray: {self.slots} x {'GPU' if 'num_gpus' in self.resources else 'CPU'}"]
        return env

    def run(self, jobs: list[Job], sink: Sink) -> None:
        grade = self.ray.remote(_grade).options(max_retries=RETRIES, retry_exceptions=False,
                                                **self.resources)
        pending = {grade.remote(unit.to_dict()): unit
                   for unit in units.split(jobs, self.slots, self.environment_problem, None)}
        self.say(f"grading on Ray: {len(pending)} unit(s) over {self.slots} slot(s)")
        deliver = units.Delivery(sink, self.say)
        while pending:
            (ref,), _ = self.ray.wait(list(pending), num_returns=1)
            unit = pending.pop(ref)
            try:
                events = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                why = f"its Ray task failed after {RETRIES} retries ({type(exc).__name__})"
                self.say(f"lost {len(unit.jobs)} job(s): {why}")
                for result in units.lost(unit.jobs, why):
                    sink.result(result)
                continue
            for event in events:
                deliver(event, f"ray unit {unit.number}", unit.number)
