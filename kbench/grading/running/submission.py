"""One slot of a device evaluating one built submission: load it in a fresh process, check
every case, recheck the outputs, time it against the reference pool; one verdict, whatever
happens in between."""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable

import torch

from kbench.grading.building import build
from kbench.grading.building.build import Built
from kbench.grading.building.watch import Watcher, tampered
from kbench.grading.channel import Ahead, Channel, Stop
from kbench.grading.checking import causes, correctness, custom_kernels, weights
from kbench.grading.checking import kernelbench_rules as kb_rules
from kbench.grading.context import Context
from kbench.grading.options import Rules
from kbench.grading.timing import alternating
from kbench.grading.timing.disturbance import Deferred, Judge
from kbench.grading.timing.reference_pool import ReferencePool
from kbench.host import backends, source_scan, spawn
from kbench.problems.discovery import Submission
from kbench.problems.task import Params
from kbench.results.run_record import Benchmark, RuleVerdict, SubmissionResult
from kbench.results.verdict import Status, Verdict
from kbench.shared import protocol


class Slot:
    """``readied``: the processes of kbench's own work readied on this device meanwhile,
    any problem's (kbench.grading.running.local), stopped while a submission is timed."""

    def __init__(self, ctx: Context, watcher: Watcher, pool: ReferencePool,
                 readied: Callable[[], list[Channel]] = list) -> None:
        self.ctx = ctx
        self.watcher = watcher
        self.pool = pool
        self.readied = readied
        self.upcoming: Submission | None = None
        self.deferred = ""  # why the last submission evaluated was deferred, by its timing

    def evaluate(self, sub: Submission, built: Built, reference: list[Benchmark],
                 upcoming: Submission | None = None, can_defer: bool = False,
                 retimed: str = "") -> SubmissionResult | None:
        """The submission's result; None where ``can_defer`` and it saw kbench's files changed
        while a build pipeline ran beside it (the change is not pinned on it), or its timing
        raised a flag while the host was disturbed (kbench.grading.timing.disturbance, the reason
        in ``deferred``): it is graded again alone once the rest is done. ``upcoming``: the
        next submission this slot grades, whose worker starts ahead (kbench.host.spawn.prestart)
        once this one's timing is over. ``retimed``: why this is such a second grading."""
        ctx = self.ctx
        source = sub.path.read_text(errors="replace")
        result = SubmissionResult(
            name=sub.name, path=str(sub.path), sha256=sub.sha256,
            status=Status.OK, flags=source_scan.flags(source),
            cases_total=kb_rules.TRIALS if _kernelbench_ranks(ctx) else len(ctx.cases),
            build_s=round(built.seconds, 2), logs=[str(ctx.logs / f"{sub.log_name}.build.log")],
            problem=ctx.task.name, backend=backends.for_source(source).name)
        self.upcoming, self.deferred = upcoming, ""
        if not ctx.options.timed:
            self._prestart()
        verdict = built.verdict
        changed = self.watcher.watch([sub.path], [ctx.logs, build.folder(ctx, sub)])
        if verdict is None:
            verdict = backends.for_source(source).cannot_run(ctx.device.type, ctx.toolchain)
        if verdict is None:
            warmed = build.warm(ctx, sub)
            result.build_s = round(built.seconds + warmed.seconds, 2)
            verdict = warmed.verdict
        if verdict is None:
            result.logs.append(str(ctx.logs / f"{sub.log_name}.run.log"))
            try:
                self._run(sub, result, reference, Judge(
                    ctx.options.cache_dir, ctx.device.type, f"{ctx.task.name}/{sub.name}",
                    final=not can_defer, retimed=retimed))
                verdict = Verdict(Status.OK)
            except Deferred as deferred:  # only where can_defer: see Judge's ``final``
                self.deferred, verdict = deferred.reason, Verdict(Status.OK)
            except Stop as stop:
                verdict, result.failure = stop.verdict, stop.failure
            except Exception as exc:  # a kbench bug must not end the run or blame the submission
                verdict = _grader_failed(exc)
        elif kb_rules.applies(ctx) and built.verdict is None:  # failed as it loaded
            verdict = self._unloaded(sub, result, verdict)
        verdict = causes.named(ctx, result, verdict)
        if kb_rules.applies(ctx) and result.kernelbench is None:
            result.kernelbench = RuleVerdict(verdict.status, verdict.reason)
        self._prestart()
        finding = changed()
        if finding.lines:  # the next worker, and the zygote, may have imported what changed
            spawn.drop_spares()
            spawn.close_zygotes()
        if can_defer and (self.deferred or finding.lines and finding.builds_beside):
            return None
        if finding.lines:
            verdict = tampered("while graded", finding.lines)
        result.status, result.reason = verdict.status, verdict.reason
        return result

    def _prestart(self) -> None:
        """The upcoming submission's worker started now, if it is not yet."""
        if self.upcoming is not None:
            sub, self.upcoming = self.upcoming, None
            spawn.prestart(self.ctx.logs / f"{sub.log_name}.run.log",
                           build.env(self.ctx, sub), self.ctx.device.type, _spare(self.ctx))

    def _run(self, sub: Submission, result: SubmissionResult,
             reference: list[Benchmark], judge: Judge) -> None:
        ctx = self.ctx
        lap = _Laps(result)
        kernelbench = _kernelbench_ranks(ctx)
        with Channel(ctx, f"{sub.log_name}.run.log", build.env(ctx, sub)) as channel:
            try:
                loaded = channel.load(sub, instantiate=True, shared_names=kernelbench)
            except Stop as stop:
                if kb_rules.applies(ctx):
                    result.kernelbench = kb_rules.judge(
                        ctx, None, sub, lambda: self._fresh(sub, result), stop.verdict)
                raise
            differ = weights.differing(ctx, loaded.weights)
            lap("load")
            # readied while it is checked (nothing is timed until timing takes them)
            rounds = _rounds_ahead(ctx, sub, reference, result)
            sizes = _profiled_sizes(ctx, reference)
            kernels = _kernels_ahead(ctx, sub, result, sizes)
            try:
                if kb_rules.applies(ctx):
                    self._kernelbench(sub, result, channel, differ, ranks=kernelbench)
                    lap("kernelbench")
                if not kernelbench:
                    try:
                        returned = correctness.check(ctx, channel, sub, result)
                    except Stop as stop:
                        stop.verdict = _explained(stop.verdict, differ)
                        raise
                    correctness.recheck(ctx, sub, returned)
                    lap("correctness")
                if ctx.options.timed:
                    self._time(channel, result, reference, judge, kernels, rounds)
                    lap("timing")
                    self._prestart()
                # What ran is profiled where the report shows it (a timed run) or a policy
                # needs it; last: the profiler stays loaded in the process that ran it.
                if ctx.options.profiles_kernels:
                    custom_kernels.judge(ctx, result, _profiled(kernels, channel, sizes))
                    lap("kernels")
            finally:  # those a failing check left unused, and the profiling one
                alternating.close_all([*rounds, *([kernels] if kernels is not None else [])])

    def _time(self, channel: Channel, result: SubmissionResult, reference: list[Benchmark],
              judge: Judge, kernels: Ahead | None, rounds: list[Ahead]) -> None:
        """Timed with kbench's own work readied beside it stopped throughout (the profiling
        process, the torch.compile baselines): on an H200 their device work (the
        profiler's start, the compiler's autotuning) ran beside four honest torch baselines'
        clocked passes, 3.8-4.5x their figures, and flagged them."""
        if kernels is not None:
            kernels.wait(0)  # its model built: its device memory is taken before the timing
        idle = [*self.readied(), *([kernels.channel] if kernels is not None else [])]
        with judge, alternating.all_frozen(idle):
            try:
                alternating.time_submission(
                    self.ctx, channel, result, reference, self.pool,
                    lambda count, warms: _taken(rounds), judge)
            finally:
                result.timed_beside = judge.record()

    def _unloaded(self, sub: Submission, result: SubmissionResult, verdict: Verdict) -> Verdict:
        """KernelBench's verdict on a submission that failed as it loaded (on one of the
        problem file's names, say), into ``result``; the verdict that ranks."""
        judged = kb_rules.judge(self.ctx, None, sub, lambda: self._fresh(sub, result), verdict)
        result.kernelbench = judged
        return Verdict(judged.status, judged.reason) if _kernelbench_ranks(self.ctx) else verdict

    def _kernelbench(self, sub: Submission, result: SubmissionResult, channel: Channel,
                     differ: list[str], ranks: bool) -> None:
        """The verdict under KernelBench's rules, into ``result``; a Stop where it ranks
        (``ranks``) and fails, or where it ended the worker (kbench's cases at the same
        sizes would fail the same way)."""
        judged = kb_rules.judge(self.ctx, channel, sub, lambda: self._fresh(sub, result))
        verdict = _explained(Verdict(judged.status, judged.reason), differ)
        result.kernelbench = RuleVerdict(verdict.status, verdict.reason, judged.passed)
        if ranks:
            result.cases_passed, result.cases_total = judged.passed, kb_rules.TRIALS
        if verdict.status is not Status.OK and (ranks or
                                                verdict.status in kb_rules.ENDS_WORKER):
            raise Stop(verdict)

    def _fresh(self, sub: Submission, result: SubmissionResult) -> Channel:
        """Another worker for the submission (KernelBench's rules, in a shared namespace)."""
        log = f"{sub.log_name}.kernelbench.log"
        result.logs.append(str(self.ctx.logs / log))
        return Channel(self.ctx, log, build.env(self.ctx, sub))


def _rounds_ahead(ctx: Context, sub: Submission, reference: list[Benchmark],
                  result: SubmissionResult) -> list[Ahead]:
    """Where the submission will take fresh-process rounds (kbench.grading.timing.alternating),
    the processes for rounds 2 to n, readied now while it is checked: each loaded from the
    warm build cache and warmed up on the launch-bound cases, so that timing waits for none
    of that (it took 4-5 of an l2norm submission's 14 timing seconds on an H200 when they
    were loaded at timing's start). On the spare cores where the run has them; else beside
    the checks, which nothing times. None where the run is untimed or no case is
    launch-bound."""
    fresh = alternating.fresh_cases(ctx, reference) if ctx.options.timed else []
    if not fresh:
        return []
    spec = ctx.load_spec()  # here, not in the threads (Channel.load)
    warms = [(reference[i].params, ctx.warm_request(reference[i].params)) for i in fresh]
    rounds = []
    for r in range(1, ctx.options.rigour.fresh_rounds):
        log = _round_log(sub, r)
        result.logs.append(str(ctx.logs / log))
        rounds.append(Ahead(ctx, log, build.env(ctx, sub), [
            lambda channel, r=r: channel.load(sub, instantiate=True, spec=spec,
                                              stage=f"load (timing round {r + 1})"),
            lambda channel: [channel.warm(params, request) for params, request in warms]]))
    return rounds


def _taken(rounds: list[Ahead]) -> list[Channel]:
    """The readied round processes, once each is ready; the first failure in round order
    (none is left open then: the rest are closed with the submission)."""
    return [ahead.take() for ahead in rounds]


class _Profile(Ahead):
    """Where what ran will be profiled and the run has spare cores: a process of the
    submission that loads it there, starts the profiler (its first start: 3.9 s on an H100)
    and profiles the calls at ``sizes`` while the submission is checked in its own process,
    stopped with the rest whenever anything is timed. On one H200 the bundled set's profiles
    cost 59 s when taken only after the timing, and 61 s so: the process is mostly still
    loading when the timing begins, and stays stopped throughout it."""

    def __init__(self, ctx: Context, sub: Submission, log: str, sizes: list[Params]) -> None:
        spec = ctx.load_spec()
        self.ran: list[protocol.KernelRun] | str = "not profiled"
        super().__init__(ctx, log, build.env(ctx, sub), [
            lambda channel: channel.load(sub, instantiate=True, spec=spec),
            lambda channel: channel.call(protocol.PrepareProfiler(), ctx.task.limits.load_s,
                                         "profile"),
            lambda channel: setattr(self, "ran", custom_kernels.profiled(ctx, channel, sizes))])


def _kernels_ahead(ctx: Context, sub: Submission, result: SubmissionResult,
                   sizes: list[Params]) -> _Profile | None:
    if not ctx.options.profiles_kernels or ctx.spare is None:
        return None
    log = f"{sub.log_name}.kernels.log"
    result.logs.append(str(ctx.logs / log))
    return _Profile(ctx, sub, log, sizes)


def _profiled(kernels: _Profile | None, channel: Channel, sizes: list[Params]
              ) -> list[protocol.KernelRun] | str:
    """What ran: as the process readied for it profiled it, else (none, or it failed) as the
    submission's own process profiles it now."""
    if kernels is not None:
        try:
            kernels.take()
            return kernels.ran
        except Stop:
            pass
    return custom_kernels.profiled(channel.ctx, channel, sizes)


def _spare(ctx: Context) -> tuple[int, ...]:
    """Where workers started ahead of their turn start (no core of the timing's), if anywhere."""
    return ctx.spare.cpus if ctx.spare else ()


def _round_log(sub: Submission, r: int) -> str:
    return f"{sub.log_name}.round{r + 1}.log"


def _grader_failed(exc: Exception) -> Verdict:
    """kbench's own failure while it graded. Its process running out of device memory is this
    device's capacity (kbench's reference outputs and float64 checks beside the submission's
    and the reference's processes), not a bug and not the submission's doing: the verdict
    that says so is never reused from the store (kbench.results.store), a larger GPU grades it."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        said = " ".join(str(exc).split(". ")[:3])
        return Verdict(Status.ENVIRONMENT_ERROR, "this GPU's memory is too small for kbench's "
                       "own checks of this problem beside its processes (a GPU with more free "
                       f"memory grades it): {said}"[:400])
    traceback.print_exc()
    return Verdict(Status.INTERNAL_ERROR, f"kbench failed: {exc!r}")


def _kernelbench_ranks(ctx: Context) -> bool:
    """--rules kernelbench, for a problem file (a task of kbench's own format has no
    KernelBench counterpart: kbench's rules judge it)."""
    return ctx.options.rules is Rules.KERNELBENCH and kb_rules.applies(ctx)


def _explained(verdict: Verdict, differ: list[str]) -> Verdict:
    """A wrong output's reason, with the weights that differ from the reference's named."""
    if differ and verdict.status is Status.WRONG_OUTPUT:
        return Verdict(Status.WRONG_OUTPUT, weights.explained(verdict.reason, differ))
    return verdict


def _profiled_sizes(ctx: Context, reference: list[Benchmark]) -> list[Params]:
    """Where what ran is profiled: the sizes that will be timed, else (untimed) the largest
    correctness case."""
    timed = [b.params for b in reference if b.reference is not None]
    return timed or [max((c.params for c in ctx.cases), key=lambda p: math.prod(p.values()))]


class _Laps:
    """Wall seconds of each stage a submission reaches, into its result's ``stage_s``."""

    def __init__(self, result: SubmissionResult) -> None:
        self.result, self.last = result, time.monotonic()

    def __call__(self, stage: str) -> None:
        now = time.monotonic()
        self.result.stage_s[stage] = round(now - self.last, 2)
        self.last = now
