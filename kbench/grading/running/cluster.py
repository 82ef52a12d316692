"""A Ray cluster, in two tiers: every submission is built by a Ray task on any node with CPUs
(restricted to nodes that offer the custom resource ``kbench_build`` where any does), and each
unit (kbench.grading.running.units) is graded by a Ray task holding one GPU (one CPU for ``--device
cpu``; restricted to ``kbench_grade`` nodes where any offers it) once its builds are out. A
build's libraries travel through Ray's object store to the node that grades it, which checks
their key and hash and builds itself on any mismatch (kbench.grading.running.ray_tasks). The run's
files travel with the tasks: every node needs kbench installed and nothing else shared. This
process alone writes the store, the logs and the reports.

Builds go out in the order units will be graded. Ray retries a task whose worker or node was
lost: a build anywhere that can take it, a unit from its start (nothing of a lost attempt
reached the store); when a unit's retries run out its jobs get infrastructure_error, which
``--resume`` grades again, and a build's, its grading node builds it. A build that saw kbench's
files change beside other builds, and a submission whose grading window saw one, are built
again alone and graded in a last unit, as on one host (kbench.grading.building.pipeline)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from kbench.grading.building import build as building
from kbench.grading.context import Say
from kbench.grading.jobs import Job, Sink
from kbench.grading.options import Device, Options, OptionsError
from kbench.grading.running import ray_node, ray_tasks, units

RETRIES = 2  # Ray's own retries of a task whose worker died, before infrastructure_error
BUILD_RESOURCE = "kbench_build"  # offered by a node: builds go only to such nodes
GRADE_RESOURCE = "kbench_grade"  # the same for grading units
BUILD_CORES = 2  # a build's Ray CPUs (MAX_JOBS): an extension's .cu and .cpp side by side


def _ray() -> Any:
    # Ray would otherwise replace builtins.print in this process with its own.
    os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
    try:
        import ray
    except ImportError:
        raise OptionsError("--executor ray needs Ray: pip install -e '.[ray]'") from None
    return ray


class RayExecutor:
    def __init__(self, options: Options, address: str | None, say: Say = lambda line: None,
                 cpu_slots: int | None = None) -> None:
        self.ray = _ray()
        self.options, self.say = options, say
        self.notes: list[str] = []  # what the run's reports say about the grading itself
        if not self.ray.is_initialized():
            local = address is None and not os.environ.get("RAY_ADDRESS")
            # "local": a new instance, never one a `ray start` left on this host.
            self.ray.init(address="local" if local else address,
                          num_cpus=cpu_slots if local else None,
                          log_to_driver=False, include_dashboard=False if local else None)
        gpu = options.device is Device.CUDA
        offered = self.ray.cluster_resources()
        self.resources = _placed({"num_gpus": 1, "num_cpus": 1} if gpu else {"num_cpus": 1},
                                 GRADE_RESOURCE, offered)
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        self.slots = int(sum(_offers(n, "GPU" if gpu else "CPU", GRADE_RESOURCE, offered)
                             for n in nodes))
        if self.slots < 1:
            raise OptionsError(f"--executor ray: the cluster has no {'GPU' if gpu else 'CPU'}"
                               + (f" on a node offering {GRADE_RESOURCE}"
                                  if GRADE_RESOURCE in offered else ""))
        most = int(max((_offers(n, "CPU", BUILD_RESOURCE, offered) for n in nodes), default=0))
        if most < 1:  # builds would wait for a CPU forever
            raise OptionsError("--executor ray: no node offers a CPU to build on"
                               + (f" among those offering {BUILD_RESOURCE}"
                                  if BUILD_RESOURCE in offered else ""))
        cores = min(BUILD_CORES, most)
        self.build_resources = _placed({"num_cpus": cores}, BUILD_RESOURCE, offered)
        self.environment_problem: str | None = None
        self.arch_list: str | None = options.cuda_arch

    def watch_store(self, presence: object) -> None:
        """Workers hold their own presences where they grade."""

    def environment(self) -> dict:
        describe = self.ray.remote(ray_tasks.describe).options(**self.resources)
        env = self.ray.get(describe.remote(self.options.to_dict()))
        self.environment_problem = env.pop("environment_problem")
        found = env.pop("arch_list")  # not part of the machine's record
        self.arch_list = self.arch_list or found
        kind = "GPU" if "num_gpus" in self.resources else "CPU"
        where = "nodes with kbench_build" if BUILD_RESOURCE in self.build_resources.get(
            "resources", {}) else "any node"
        env["slots"] = [f"ray: {self.slots} x {kind}; builds on {where}, "
                        f"{self.build_resources['num_cpus']} CPU(s) each"]
        return env

    def run(self, jobs: list[Job], sink: Sink) -> None:
        jobs = [ray_node.absolute(job) for job in jobs]
        run = self.ray.put(ray_node.bundle(jobs))
        plan = units.split(jobs, self.slots, self.environment_problem, None)
        tier = _Tier(self, run, plan, sink)
        self.say(f"building {len(jobs)} submission(s) on Ray ({tier.cores} CPU(s) each, "
                 f"{tier.where}), then {len(plan)} unit(s) over {self.slots} grading slot(s)")
        for unit in plan:
            for job in unit.jobs:
                tier.build(job)
        tier.wait_all()
        again = [tier.rebuilt(job) for job in tier.suspects] + tier.deliver.deferred
        if again:
            self.say(f"grading {len(again)} submission(s) again, in one unit, now that the "
                     "builds are done")
            tier.grade(replace(plan[0], jobs=again, number=len(plan), final=True))
            tier.wait_all()
        self.notes += [f"built on Ray node {node} ({host}): {', '.join(names)}"
                       for (node, host), names in tier.placed.items()]


class _Tier:
    """The run's build and grading tasks in flight, and what came back of them."""

    def __init__(self, executor: RayExecutor, run: Any, plan: list[units.Unit], sink: Sink
                 ) -> None:
        self.ray, self.say, self.run = executor.ray, executor.say, run
        self.options = executor.options
        cores = executor.build_resources["num_cpus"]
        self.where = "on nodes offering kbench_build" \
            if "resources" in executor.build_resources else "on any node with CPUs"
        self.build_task = self.ray.remote(ray_tasks.build).options(
            num_returns=2, max_retries=RETRIES, retry_exceptions=False,
            **executor.build_resources)
        self.grade_task = self.ray.remote(ray_tasks.grade).options(
            max_retries=RETRIES, retry_exceptions=False, **executor.resources)
        self.cores, self.arch = cores, executor.arch_list
        self.waiting = list(plan)  # units whose builds are not all out
        self.reports: dict[str, tuple[ray_tasks.BuildReport | None, Any]] = {}
        self.pending: dict[Any, tuple[str, Any]] = {}
        self.suspects: list[Job] = []
        self.placed: dict[tuple[str, str], list[str]] = {}  # (node, host): what it built
        self.deliver = units.Delivery(sink, self.say)
        self.total = sum(len(u.jobs) for u in plan)
        self.graded = self.units = 0

    def build(self, job: Job, alone: bool = False) -> Any:
        options = replace(job.options, cuda_arch=self.arch)  # the grading nodes' architectures
        report, artifact = self.build_task.remote(self.run, replace(job, options=options)
                                                  .to_dict(), self.cores, alone)
        self.pending[report] = ("build", (job, artifact))
        return report

    def rebuilt(self, job: Job) -> Job:
        """A suspect built again with no other build beside it (on its node or any other)."""
        self.build(job, alone=True)
        self.wait_all()
        return job

    def grade(self, unit: units.Unit) -> None:
        found = [self.reports.get(j.path, (None, None)) for j in unit.jobs]
        self.pending[self.grade_task.remote(self.run, unit.to_dict(), [r for r, _ in found],
                                            *[a for _, a in found])] = ("grade", unit)
        self.units += 1

    def wait_all(self) -> None:
        while self.pending:
            (ref,), _ = self.ray.wait(list(self.pending), num_returns=1)
            kind, what = self.pending.pop(ref)
            if kind == "build":
                self._built(ref, *what)
            else:
                self._graded(ref, what)

    def _built(self, ref: Any, job: Job, artifact: Any) -> None:
        try:
            report = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            self.say(f"{job.problem}: {job.name}: its build task failed after {RETRIES} "
                     f"retries ({type(exc).__name__}): built where it is graded")
            report, artifact = None, None
        if report is not None:
            ray_node.write_logs(report.logs, self.options.out_dir)
            if report.suspect:
                self.suspects.append(job)
            done = building.outcome(report.built, job.submission().path.read_text(
                errors="replace")) if report.built else \
                f"left to its grading node ({report.note})"
            shipped = f", {report.shipped / 1e6:.1f} MB to ship" if report.shipped else ""
            self.placed.setdefault((report.where.node, report.where.host), []).append(job.name)
            self.say(f"{job.problem}: {job.name} {done} on {report.where.host} "
                     f"(node {report.where.node[:8]}{shipped})")
        self.reports[job.path] = (report, artifact)
        self._progress()
        for unit in list(self.waiting):
            if all(j.path in self.reports for j in unit.jobs):
                self.waiting.remove(unit)
                left = [j for j in unit.jobs if j not in self.suspects]
                if left:
                    self.grade(unit.rest(left))

    def _graded(self, ref: Any, unit: units.Unit) -> None:
        try:
            report = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            why = f"its Ray task failed after {RETRIES} retries ({type(exc).__name__})"
            self.say(f"lost {len(unit.jobs)} job(s): {why}")
            for result in units.lost(unit.jobs, why):
                self.deliver.sink.result(result)
            return
        ray_node.write_logs(report.logs, self.options.out_dir)
        for event in report.events:
            self.deliver(event, f"ray unit {unit.number} on {report.where.host}", unit.number)
        self.graded += 1
        self._progress()

    def _progress(self) -> None:
        self.say(f"ray: builds {len(self.reports)}/{self.total} "
                 f"back, units graded {self.graded}/{self.units} sent "
                 f"({len(self.waiting)} waiting for builds)")


def _placed(resources: dict, marker: str, offered: dict) -> dict:
    """``resources``, and a sliver of ``marker`` where some node offers it (then only those
    nodes take the task)."""
    return {**resources, "resources": {marker: 0.001}} if marker in offered else resources


def _offers(node: dict, kind: str, marker: str, offered: dict) -> float:
    """The node's ``kind`` (GPU, CPU) that tasks needing ``marker`` may use there."""
    if marker in offered and marker not in node["Resources"]:
        return 0.0
    return node["Resources"].get(kind, 0.0)
