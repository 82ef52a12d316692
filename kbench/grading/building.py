"""Building: each submission imported once in its own process, which compiles its extensions
into a build folder of its own; in parallel, watched (kbench.grading.watch)."""

from __future__ import annotations

import os
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import psutil

from kbench import backends, protocol
from kbench.build import build_dir
from kbench.discovery import Submission
from kbench.grading.channel import Channel, Stop
from kbench.grading.context import Context
from kbench.grading.watch import Watcher, tampered
from kbench.sandbox import child_env
from kbench.verdict import Status, Verdict


@dataclass(frozen=True)
class Built:
    verdict: Verdict | None  # None: built (or nothing to build)
    seconds: float


def folder(ctx: Context, sub: Submission) -> Path:
    return build_dir(ctx.options.cache_dir, sub.path, ctx.toolchain)


def env(ctx: Context, sub: Submission, parallel: int = 1) -> dict[str, str]:
    """The environment of the submission's processes, its build folder marked as used now
    (kbench prune keeps what recent runs used); ``parallel`` builds share the cores."""
    path = folder(ctx, sub)
    path.mkdir(parents=True, exist_ok=True)
    os.utime(path)
    cores = max(1, (ctx.options.cores or psutil.cpu_count() or 1) // parallel)
    backend = backends.for_source(sub.path.read_text(errors="replace"))
    return child_env(backend.env(ctx.toolchain, path, cores))


def build_all(ctx: Context, watcher: Watcher, submissions: list[Submission],
              environment_problem: str | None) -> dict[Submission, Built]:
    """Build in parallel, as many at a time as ``--jobs`` allows and there are builds, the
    cores split between them. If a build wrote to kbench's files, the files are put right and
    the builds run again one at a time (from the warm cache) to find which: that one is
    flagged."""
    parallel = max(1, min(ctx.options.jobs, len(submissions)))
    ignore = [ctx.logs] + [folder(ctx, s) for s in submissions]
    changed = watcher.watch([s.path for s in submissions], ignore)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(_build, ctx, s, parallel, environment_problem): s
                   for s in submissions}
        built = {}
        for future in as_completed(futures):  # a line as each ends: builds take minutes
            sub = futures[future]
            built[sub] = future.result()
            ctx.say(f"{ctx.task.name}: {sub.name} {_outcome(built[sub])}")
        built = {s: built[s] for s in submissions}
    if not changed():
        return built
    for sub in submissions:
        changed = watcher.watch([sub.path], [ctx.logs, folder(ctx, sub)])
        built[sub] = _build(ctx, sub, 1, environment_problem)
        if lines := changed():
            built[sub] = Built(tampered("while building", lines), built[sub].seconds)
    return built


_JIT_WARMING = threading.Lock()  # builds run in parallel; warm-ups use the device one at a time


def _warm(ctx: Context, channel: Channel, sub: Submission) -> None:
    """A kernel language that compiles at a kernel's first launch: each correctness case's
    sizes and dtype run once here, so that compilation falls in the build stage, under its
    deadline, into the submission's own cache (kbench.backends.python_dsl), and the cases'
    deadlines time the kernels, not the compiler. A compile error stops the build
    (build_error, kbench.verdict); any other failure is left to the correctness stage, which
    names the case."""
    channel.load(sub, instantiate=True, stage="build (JIT warm-up)")
    seen = set()
    for case in ctx.cases:
        if (key := repr((case.params, case.dtype))) in seen:
            continue
        seen.add(key)
        inputs = ctx.draw(case.params, case.dtype, case.distribution, case.seed)
        try:
            channel.call(protocol.Run(inputs, ctx.spec(case.params, case.dtype)),
                         ctx.task.limits.build_s, f"build (JIT warm-up, {case.describe()})")
        except Stop as stop:
            if stop.verdict.status is Status.BUILD_ERROR:
                raise
            return
        finally:
            del inputs


def _outcome(built: Built) -> str:
    if built.verdict is None:
        return f"built in {built.seconds:.0f} s"
    took = f" after {built.seconds:.0f} s" if built.seconds else ""
    return f"not built{took}: {built.verdict.status.value}"


def _build(ctx: Context, sub: Submission, parallel: int,
           environment_problem: str | None) -> Built:
    """Import the submission once in its own process: this compiles its extensions."""
    source = sub.path.read_text(errors="replace")
    backend = backends.for_source(source)
    if verdict := backend.unavailable(ctx.toolchain, environment_problem, source):
        return Built(verdict, 0.0)
    start = time.monotonic()
    try:
        environment = env(ctx, sub, parallel)
        with Channel(ctx, f"{sub.name}.build.log", environment) as channel:
            channel.load(sub, instantiate=False, stage="build")
        if backend.jit and ctx.device.type == "cuda":
            with _JIT_WARMING, Channel(ctx, f"{sub.name}.warm.log", environment) as channel:
                _warm(ctx, channel, sub)
    except Stop as stop:
        return Built(stop.verdict, time.monotonic() - start)
    except Exception as exc:  # a kbench bug must not end the run or blame the submission
        traceback.print_exc()
        return Built(Verdict(Status.INTERNAL_ERROR, f"kbench failed: {exc!r}"),
                     time.monotonic() - start)
    return Built(None, time.monotonic() - start)
