"""The Ray tasks of kbench.grading.running.cluster, as they run on a node: the grading machine
described, one submission built (on any node with CPUs), and one unit graded (on a GPU node)
with the builds shipped to it, each checked before it is used (kbench.host.artifacts)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from kbench.grading.building import build as building
from kbench.grading.building.build import Built
from kbench.grading.building.guard import BuildMark
from kbench.grading.building.watch import Watcher, tampered
from kbench.grading.context import Context
from kbench.grading.jobs import Job
from kbench.grading.options import Options
from kbench.grading.running import units
from kbench.grading.running.local import LocalExecutor
from kbench.grading.running.ray_node import Bundle, Node, Where
from kbench.host import artifacts, paths
from kbench.host.artifacts import Artifact
from kbench.host.build_dirs import build_dir
from kbench.host.toolchain import Toolchain, find_toolchain
from kbench.problems.load import load_task
from kbench.results.verdict import Status

_INSTALL_WAIT_S = 600.0  # for a build folder another process of this node holds
_NOT_HERE = (Status.SKIPPED, Status.ENVIRONMENT_ERROR)  # this node lacks what it needs


@dataclass(frozen=True)
class BuildReport:
    path: str  # the job's file, on the driver
    built: Built | None  # None: the grading node builds it itself
    where: Where
    logs: dict[str, bytes]  # its build log, by path in the output folder
    note: str = ""  # why the grading node builds it, where it does
    suspect: bool = False  # kbench's files changed meanwhile: built again alone at the end
    shipped: int = 0  # bytes of the build sent on


@dataclass(frozen=True)
class UnitReport:
    events: list[units.Event]
    logs: dict[str, bytes]
    where: Where


def describe(options: dict) -> dict:
    """The grading machine, as LocalExecutor records it, with what builds must target."""
    cache = paths.default_cache_dir().resolve()
    executor = LocalExecutor(Options.from_dict(
        {**options, "cache_dir": cache, "out_dir": cache / "ray" / "describe"}), pin=False)
    env = executor.environment()
    env["environment_problem"] = executor.environment_problem
    env["arch_list"] = executor.toolchain.arch_list
    return env


def build(run: Bundle, job: dict, cores: int, alone: bool
          ) -> tuple[BuildReport, Artifact | None]:
    """One submission built here, watched, its libraries recorded and packed to travel."""
    node = Node(run)
    driver = Job.from_dict(job)
    local = node.job(driver)
    toolchain = _toolchain(local.options)
    where = node.where()
    try:
        ctx = Context.for_building(load_task(local.task, local.problem), local.options,
                                   toolchain)
    except Exception as exc:  # the grading node loads it again and reports why
        return BuildReport(driver.path, None, where, node.logs(),
                           f"its problem did not load on {where.host} ({exc})"), None
    built, lines = _watched(node, ctx, local, cores)
    folder = building.folder(ctx, local.submission())

    def report(result: Built | None, note: str = "", suspect: bool = False,
               artifact: Artifact | None = None) -> tuple[BuildReport, Artifact | None]:
        return BuildReport(driver.path, result, where, node.logs(), note, suspect,
                           artifact.size if artifact else 0), artifact

    if lines and not alone:
        return report(None, "kbench's files changed while it built beside others", True)
    if lines:
        return report(Built(tampered("while building", lines), built.seconds))
    if built.verdict is not None and built.verdict.status in _NOT_HERE:
        return report(None, f"not built on {where.host}: {built.verdict.reason}")
    if built.verdict is not None:
        return report(built)
    artifact = artifacts.pack(folder, artifacts.key(toolchain, driver.sha256))
    if artifact is None and artifacts.unrecorded(folder):
        return report(None, "it builds libraries load_inline did not record")
    return report(built, artifact=artifact)


def _watched(node: Node, ctx: Context, job: Job, cores: int) -> tuple[Built, list[str]]:
    """The build, with a window over kbench's code and the run's files, as the host's pipeline
    keeps one (kbench.grading.building.pipeline): the build folders of every build of this run
    started on this node are left out (they fill them), any other change counts. Grading
    windows on this node meanwhile see builds beside them (BuildMark)."""
    sub = job.submission()
    folder = building.folder(ctx, sub)
    started = node.root / "building"
    started.mkdir(parents=True, exist_ok=True)
    (started / folder.name).touch()
    watcher = Watcher(ctx.options)
    watcher.for_run(*node.run_files())
    watcher.for_task(ctx)
    changed = watcher.watch([sub.path], [ctx.logs], builds=True)
    mark = BuildMark(ctx.options.cache_dir)
    mark.hold()
    try:
        built = building.build(ctx, sub, None, cores, record=True)
        lines = changed([folder.parent / name for name in os.listdir(started)]).lines
        if lines:
            mark.repaired()
    finally:
        mark.release()
    return built, lines


def grade(run: Bundle, unit: dict, reports: list[BuildReport | None],
          *shipped: Artifact | None) -> UnitReport:
    """One unit graded on this node's device. A build shipped here is unpacked into this
    node's own build folder for the file when its key and hash check out; any other job is
    built here first (LocalExecutor does that for a job without a build)."""
    node = Node(run)
    driver = units.Unit.from_dict(unit)
    jobs = [node.job(j) for j in driver.jobs]
    toolchain = _toolchain(jobs[0].options)
    built: dict[str, Built] = {}
    notes: list[units.Event] = []
    for job, report, artifact in zip(jobs, reports, shipped, strict=True):
        if report is None or report.built is None:
            if report is not None and report.note:
                notes.append(units.Event(
                    say=f"{job.problem}: {job.name} is built here: {report.note}"))
            continue
        if artifact is not None:
            folder = build_dir(job.options.cache_dir, Path(job.path), toolchain)
            why = artifacts.install(artifact, folder, artifacts.key(toolchain, job.sha256),
                                    _INSTALL_WAIT_S)
            if why:
                notes.append(units.Event(say=f"{job.problem}: {job.name}: the build from "
                                             f"{report.where.host} is not used ({why}); "
                                             "built here"))
                continue
        built[job.path] = report.built
    tasks, files = node.run_files()
    events: list[units.Event] = list(notes)
    units.run(replace(driver, jobs=jobs, built=built, cores=None, run_tasks=tasks,
                      run_files=files), events.append)
    return UnitReport(node.back(events, str(driver.jobs[0].options.out_dir)), node.logs(),
                      node.where())


def _toolchain(options: Options) -> Toolchain:
    return find_toolchain(options.cuda_arch, options.cache_dir / "toolkits")
