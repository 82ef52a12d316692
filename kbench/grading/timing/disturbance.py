"""The re-time-alone rule. A flag from a check that host load can fool (kbench's own clock and
the ordering check: kbench.grading.timing.integrity.TimingFlag) raised while the host was disturbed,
by another build or timing of kbench beside it (kbench.host.activity) or by other processes
keeping cores busy (kbench.host.load), is not final: the submission is graded again alone once
everything else of the run is done, so that load that passes (builds, other slots' timings)
convicts nobody. A clock that could not read the calls at all (integrity._best_pass) accuses
nobody: graded again alone, and if still unreadable there, a note and the interval widened.
There, on a host still busy, the clock's flag stands unless (on a CPU) the reference's own
calls, timed then on the same clock, were stretched as much
(kbench.grading.timing.integrity._reference_inflation): a fixed allowance for load cannot be
granted safely, because load inflates a forged stopwatch's own figures too (under one of 2x,
a stopwatch forged to a third was graded ok on a CI machine), while a stretch the reference
shows is the load's. The ordering check's flag stands too: the side work it saw is the least
the device stayed busy after the call over every sample, less the least for a probe with
none (kbench.grading.timing.measurement), which load only lengthens, and tolerated on a host
busy to the end it let work hidden on a private stream through at the sizes too small to
charge (an H200 beside 32 busy processes: ok at 2.9x, its honest twin 0.77x). A clock flag
that load explains leaves the call's interval widened to what the check saw."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType

from kbench.grading.timing.integrity import TimingFlag
from kbench.host import activity, load
from kbench.results.run_record import TimedBeside, params_text
from kbench.results.verdict import Status, Verdict

_SHOWN = 8  # overlapping builds and timings named in a result; the rest counted


class Deferred(Exception):  # noqa: N818 (not an error: the submission is graded again)
    """A timing flag raised on a disturbed host, in a pass that is not the run's last: the
    submission is to be graded again alone at the end."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Judge:
    """One submission's timing: what ran beside it, and the rule applied to its flags.
    ``final``: nothing of the run is left to run beside it (its last chance to be timed);
    ``retimed``: why it is being timed again, if it is."""

    def __init__(self, cache_dir: str, device: str, name: str, final: bool,
                 retimed: str = "") -> None:
        self.log = activity.Log(cache_dir)
        self.device, self.name, self.final, self.retimed = device, name, final, retimed
        self.notes: list[str] = []
        self.meter: load.Meter | None = None
        self.span: activity.Span | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Judge:
        self.span = self._stack.enter_context(self.log.record("timing", self.name))
        self.meter = load.Meter()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stack.close()

    def checked(self, check: Callable[[], None]) -> None:
        """Run one check; a TimingFlag it raises is judged by the rule."""
        try:
            check()
        except TimingFlag as flag:
            self._decide(flag)

    def disturbed(self) -> bool:
        """Is the host disturbed so far (its load; the run's builds and timings beside, except
        in the last pass, where the log is not asked)?"""
        return self.meter.read().disturbed or (not self.final and bool(self._beside()))

    def loaded(self) -> bool:
        """Did processes other than kbench's keep the host's cores busy so far (its load;
        kbench's own builds and timings beside it not counted)?"""
        return self.meter.read().disturbed

    def record(self) -> TimedBeside:
        reading, beside = self.meter.read(), self._beside()
        return TimedBeside(seconds=round(reading.seconds, 2),
                           other_busy_cores=round(reading.other_busy_cores, 2),
                           load_avg=reading.load_avg, cores=reading.cores,
                           beside=_named(beside), disturbed=reading.disturbed or bool(beside),
                           retimed_alone=self.retimed, notes=list(self.notes))

    def _beside(self) -> list[activity.Span]:
        return self.log.beside(self.span) if self.span is not None else []

    def _decide(self, flag: TimingFlag) -> None:
        reading = self.meter.read()
        # In the last pass the run is alone by construction; the log, which a submission's
        # process could write to, is not asked there.
        beside = [] if self.final else self._beside()
        if not reading.disturbed and not beside and flag.accuses:
            raise flag
        why = reading.text() + (f"; beside it: {', '.join(_named(beside))}" if beside else "")
        if not self.final:
            raise Deferred(f"{flag.verdict.reason} (while {why})")
        if not flag.accuses:  # no reading, so no accusation: said, the interval widened
            self._tolerate(flag, why)
            return
        explained = flag.load_explains() if flag.check == "clock" else None
        if explained is None:
            raise TimingFlag(Verdict(Status.FLAGGED, f"{flag.verdict.reason}; timed again "
                                     f"alone at the end, the host still disturbed ({why})"),
                             flag.check, flag.bench, flag.seen_ms, flag.explained_ms)
        self._tolerate(flag, f"{why}; {explained}")

    def _tolerate(self, flag: TimingFlag, why: str) -> None:
        """ok, said so, and the call's interval widened to what the check saw."""
        bench, size = flag.bench, params_text(flag.bench.params)
        widened = ""
        if flag.seen_ms is not None and bench.candidate is not None:
            bench.candidate.ci[1] = max(bench.candidate.ci[1], flag.seen_ms)
            widened = f"; its interval is widened to {flag.seen_ms:.4g} ms, what the clock saw"
        self.notes.append(f"timing disturbed at {size}: {flag.check} check could not tell, "
                          f"the host staying busy when it was timed alone at the end ({why}); "
                          f"it said: {flag.verdict.reason}{widened}")


def _named(spans: list[activity.Span]) -> list[str]:
    names = list(dict.fromkeys(s.text() for s in spans))
    return names[:_SHOWN] + ([f"and {len(names) - _SHOWN} more"] if len(names) > _SHOWN
                             else [])
