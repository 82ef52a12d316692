"""Building one submission: imported once in its own process, which compiles its extensions
into a build folder of its own (kbench.grading.building.pipeline runs many at once, watched); and,
for a kernel language that compiles at a kernel's first launch, the warm-up that compiles it on the
device the slot grades on."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from kbench.grading.channel import Channel, Stop
from kbench.grading.context import Context
from kbench.host import artifacts, backends, build_lock, failed_builds, pch, source_scan
from kbench.host.build_dirs import build_dir
from kbench.problems.discovery import Submission
from kbench.results.verdict import Status, Verdict
from kbench.sandbox import child_env
from kbench.shared import protocol


@dataclass(frozen=True)
class Built:
    verdict: Verdict | None  # None: built (or nothing to build)
    seconds: float
    cleared: str = ""  # what an interrupted earlier build left, removed first (build_lock)

    def to_dict(self) -> dict:
        verdict = self.verdict
        return {"status": None if verdict is None else verdict.status.value,
                "reason": "" if verdict is None else verdict.reason, "seconds": self.seconds,
                "cleared": self.cleared}

    @classmethod
    def from_dict(cls, data: dict) -> Built:
        status = data["status"]
        return cls(None if status is None else Verdict(Status(status), data["reason"]),
                   data["seconds"], data.get("cleared", ""))


def folder(ctx: Context, sub: Submission) -> Path:
    return build_dir(ctx.options.cache_dir, sub.path, ctx.toolchain)


def env(ctx: Context, sub: Submission, cores: int | None = None, record: bool = False
        ) -> dict[str, str]:
    """The environment of the submission's processes, its build folder marked as used now
    (kbench prune keeps what recent runs used); ``cores``: what one build may use.
    ``record``: the build notes each load_inline call's library, to ship it to another node;
    a folder unpacked from one loads those libraries (kbench.worker.prebuilt)."""
    path = folder(ctx, sub)
    path.mkdir(parents=True, exist_ok=True)
    os.utime(path)
    cores = cores or ctx.options.cores or psutil.cpu_count() or 1
    backend = backends.for_source(sub.path.read_text(errors="replace"))
    compiler = pch.env(ctx.options.cache_dir, ctx.toolchain) if ctx.options.pch else {}
    mode = "record" if record else "replay" if artifacts.shipped(path) else ""
    prebuilt = {"KBENCH_PREBUILT": mode} if mode else {}
    return child_env({**backend.env(ctx.toolchain, path, cores), **compiler, **prebuilt})


def warm(ctx: Context, sub: Submission) -> Built:
    """A kernel language that compiles at a kernel's first launch, on a GPU: each correctness
    case's sizes and dtype run once, so that compilation falls in the build stage, under its
    deadline, into the submission's own cache (kbench.host.backends.python_dsl), and the cases'
    deadlines time the kernels, not the compiler. A compile error is the build's
    (build_error, kbench.results.verdict); any other failure is left to the correctness stage, which
    names the case. Nothing to do (no time) for anything else."""
    if not (backends.for_source(sub.path.read_text(errors="replace")).jit
            and ctx.device.type == "cuda"):
        return Built(None, 0.0)
    def run() -> None:
        with Channel(ctx, f"{sub.log_name}.warm.log", env(ctx, sub)) as channel:
            _warm(ctx, channel, sub)
    return _locked(ctx, sub, run, ctx.task.limits.build_s)


def _warm(ctx: Context, channel: Channel, sub: Submission) -> None:
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


def outcome(built: Built, source: str) -> str:
    """A build as a progress line says it: compiled, or (nothing to compile) imported."""
    cleared = f" ({built.cleared})" if built.cleared else ""
    done, undone = ("built", "not built") if source_scan.compiles(source) else \
        ("imported", "did not import")
    if built.verdict is None:
        return f"{done} in {built.seconds:.0f} s{cleared}"
    took = f" after {built.seconds:.0f} s" if built.seconds else ""
    return f"{undone if took else 'not built'}{took}: {built.verdict.status.value}{cleared}"


def build(ctx: Context, sub: Submission, environment_problem: str | None, cores: int,
          cpus: tuple[int, ...] = (), nice: int = 0, lock_wait_s: float | None = None,
          record: bool = False) -> Built:
    """Import the submission once in its own process, on ``cpus`` at ``nice``: this compiles
    its extensions (with ``cores`` at most), holding its build folder's lock (waiting up to
    ``lock_wait_s`` for another kbench process that builds it, default the build's limit;
    kbench.host.build_lock.Busy after that); ``record``: as ``env`` says."""
    source = sub.path.read_text(errors="replace")
    backend = backends.for_source(source)
    if verdict := backend.unavailable(ctx.toolchain, environment_problem, source):
        return Built(verdict, 0.0)
    if not ctx.options.build_all and (verdict := backend.unbuilt(ctx.device.type,
                                                                 ctx.toolchain, source)):
        return Built(verdict, 0.0)
    built_env = env(ctx, sub, cores, record)

    def run() -> None:
        with Channel(ctx, f"{sub.log_name}.build.log", built_env, cpus, nice) as channel:
            channel.load(sub, instantiate=False, stage="build")
    wait = ctx.task.limits.build_s if lock_wait_s is None else lock_wait_s
    return _locked(ctx, sub, run, wait, built_env)


def _locked(ctx: Context, sub: Submission, run: Callable[[], None], wait_s: float,
            built_env: dict[str, str] | None = None) -> Built:
    """``run`` as a build (``_timed``) under the build folder's lock, after what an
    interrupted build left there is cleared (kbench.host.build_lock). With ``built_env`` (a
    build's, not a JIT warm-up's), a compiler's failure kept from an earlier build of the same
    inputs is the verdict without building, and this build's is kept
    (kbench.host.failed_builds)."""
    where, log = folder(ctx, sub), ctx.logs / f"{sub.log_name}.build.log"
    with build_lock.held(where, wait_s) as cleared:
        if built_env is not None and (kept := failed_builds.kept(where, built_env, log)):
            return Built(kept, 0.0)
        built = _timed(run)
        if built_env is not None:
            failed_builds.keep(where, built_env, built.verdict, log)
    return replace(built, cleared="; ".join(cleared)) if cleared else built


def _timed(run: Callable[[], None]) -> Built:
    """``run``'s outcome as a build's, with its seconds: a Stop's verdict, or (a kbench bug
    must neither end the run nor blame the submission) internal_error."""
    start = time.monotonic()
    try:
        run()
    except Stop as stop:
        return Built(stop.verdict, time.monotonic() - start)
    except Exception as exc:
        traceback.print_exc()
        return Built(Verdict(Status.INTERNAL_ERROR, f"kbench failed: {exc!r}"),
                     time.monotonic() - start)
    return Built(None, time.monotonic() - start)
