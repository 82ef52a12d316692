"""One slot of a device evaluating one built submission: load it in a fresh process, check
every case, recheck the outputs, time it against the reference pool; one verdict, whatever
happens in between."""

from __future__ import annotations

import math
import time
import traceback

from kbench import backends, sandbox, scan
from kbench.discovery import Submission
from kbench.grading import building, correctness, custom_kernels, rounds, weights
from kbench.grading.building import Built
from kbench.grading.channel import Channel, Stop
from kbench.grading.context import Context
from kbench.grading.reference_pool import ReferencePool
from kbench.grading.watch import Watcher, tampered
from kbench.results import Benchmark, SubmissionResult
from kbench.task import Params
from kbench.verdict import Status, Verdict


class Slot:
    def __init__(self, ctx: Context, watcher: Watcher, pool: ReferencePool) -> None:
        self.ctx = ctx
        self.watcher = watcher
        self.pool = pool
        self.upcoming: Submission | None = None

    def evaluate(self, sub: Submission, built: Built, reference: list[Benchmark],
                 upcoming: Submission | None = None, can_defer: bool = False
                 ) -> SubmissionResult | None:
        """The submission's result; None where it saw kbench's files changed while a build
        pipeline ran beside it and ``can_defer`` (the change is not pinned on it: it is graded
        again once the builds are done). ``upcoming``: the next submission this slot grades,
        whose worker starts ahead (kbench.sandbox.prestart) once this one's timing is over."""
        ctx = self.ctx
        source = sub.path.read_text(errors="replace")
        result = SubmissionResult(
            name=sub.name, path=str(sub.path), sha256=sub.sha256,
            status=Status.OK, cases_total=len(ctx.cases), flags=scan.flags(source),
            build_s=round(built.seconds, 2), logs=[str(ctx.logs / f"{sub.log_name}.build.log")],
            problem=ctx.task.name, backend=backends.for_source(source).name)
        self.upcoming = upcoming
        if not ctx.options.timed:
            self._prestart()
        verdict = built.verdict
        changed = self.watcher.watch([sub.path], [ctx.logs, building.folder(ctx, sub)])
        if verdict is None:
            verdict = backends.for_source(source).cannot_run(ctx.device.type, ctx.toolchain)
        if verdict is None:
            warmed = building.warm(ctx, sub)
            result.build_s = round(built.seconds + warmed.seconds, 2)
            verdict = warmed.verdict
        if verdict is None:
            result.logs.append(str(ctx.logs / f"{sub.log_name}.run.log"))
            try:
                self._run(sub, result, reference)
                verdict = Verdict(Status.OK)
            except Stop as stop:
                verdict, result.failure = stop.verdict, stop.failure
            except Exception as exc:  # a kbench bug must not end the run or blame the submission
                traceback.print_exc()
                verdict = Verdict(Status.INTERNAL_ERROR, f"kbench failed: {exc!r}")
        self._prestart()
        finding = changed()
        if finding.lines:  # the next worker may have imported what was changed
            sandbox.drop_spares()
        if finding.lines and finding.builds_beside and can_defer:
            return None
        if finding.lines:
            verdict = tampered("while graded", finding.lines)
        result.status, result.reason = verdict.status, verdict.reason
        return result

    def _prestart(self) -> None:
        """The upcoming submission's worker started now, if it is not yet."""
        if self.upcoming is not None:
            sub, self.upcoming = self.upcoming, None
            sandbox.prestart(self.ctx.logs / f"{sub.log_name}.run.log",
                             building.env(self.ctx, sub), self.ctx.device.type)

    def _run(self, sub: Submission, result: SubmissionResult,
             reference: list[Benchmark]) -> None:
        ctx = self.ctx
        lap = _Laps(result)
        with Channel(ctx, f"{sub.log_name}.run.log", building.env(ctx, sub)) as channel:
            differ = weights.differing(ctx, channel.load(sub, instantiate=True).weights)
            lap("load")
            try:
                returned = correctness.check(ctx, channel, sub, result)
            except Stop as stop:
                if differ and stop.verdict.status is Status.WRONG_OUTPUT:
                    stop.verdict = Verdict(Status.WRONG_OUTPUT,
                                           weights.explained(stop.verdict.reason, differ))
                raise
            correctness.recheck(ctx, sub, returned)
            lap("correctness")
            if ctx.options.timed:
                rounds.time_submission(ctx, channel, result, reference, self.pool,
                                       lambda r: self._round_channel(sub, r, result))
                lap("timing")
                self._prestart()
            # What ran is profiled where the report shows it (a timed run) or a policy needs
            # it; last: the profiler stays loaded in the process.
            if ctx.device.type == "cuda" and (ctx.options.timed or
                                              ctx.options.require_custom_kernels):
                custom_kernels.measure(ctx, channel, result, _profiled_sizes(ctx, reference))
                lap("kernels")

    def _round_channel(self, sub: Submission, r: int, result: SubmissionResult) -> Channel:
        """A new process for round ``r`` of the submission's launch-bound cases (see
        kbench.grading.rounds), its instance loaded from the warm build cache."""
        log = f"{sub.log_name}.round{r + 1}.log"
        result.logs.append(str(self.ctx.logs / log))
        channel = Channel(self.ctx, log, building.env(self.ctx, sub))
        try:
            channel.load(sub, instantiate=True, stage=f"load (timing round {r + 1})")
        except BaseException:
            channel.close()
            raise
        return channel


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
