"""The trusted side's end of one worker: kbench.shared.protocol's requests out, typed answers back,
and every way a request can fail turned into a Stop carrying the verdict it earns."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

from kbench.grading.context import Context
from kbench.problems.discovery import Submission
from kbench.problems.task import Params
from kbench.results import verdict as verdicts
from kbench.results.run_record import params_text
from kbench.results.verdict import Status, Verdict
from kbench.sandbox import Sandbox, SandboxFailure
from kbench.shared import protocol


class Stop(Exception):
    """Grading of one submission ends here with ``verdict``."""

    def __init__(self, verdict: Verdict, failure: dict | None = None) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.failure = failure


class Channel:
    """One worker process (kbench.sandbox) for one submission or reference."""

    def __init__(self, ctx: Context, log_name: str, env: dict[str, str],
                 cpus: tuple[int, ...] = (), nice: int = 0) -> None:
        limits = ctx.task.limits
        self.ctx = ctx
        self.log = ctx.logs / log_name
        self.box = Sandbox(self.log, env, memory_bytes=int(limits.host_memory_gib * 2**30),
                           log_bytes=int(limits.log_mib * 2**20), cpus=cpus, nice=nice)
        self.timed: set[str] = set()  # the cases timed in this process (Context.timing)

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.box.close()

    def frozen(self) -> contextlib.AbstractContextManager[None]:
        """Its processes stopped meanwhile (kbench.sandbox.Sandbox.frozen)."""
        return self.box.frozen()

    def place(self, cpus: tuple[int, ...]) -> None:
        self.box.place(cpus)

    def call(self, request: protocol.Request, timeout: float, stage: str) -> protocol.Answer:
        """One request and its answer, decoded and checked (kbench.shared.protocol)."""
        try:
            raw = self.box.request(request, timeout)
        except SandboxFailure as failure:
            message = failure.message
            if failure.fate.value == "crashed":
                message += _last_output(self.box.log_text(4096))
            raise Stop(verdicts.from_fate(failure.fate.value, stage, message)) from None
        try:
            answer = protocol.decode(raw, request.answers)
        except protocol.BadSamples as exc:
            raise Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: {exc}")) from None
        except Exception as exc:  # ProtocolError, or hostile data that broke the decoding
            self.box.kill()
            why = str(exc)[:300] if isinstance(exc, protocol.ProtocolError) else \
                type(exc).__name__
            raise Stop(Verdict(Status.RUNTIME_ERROR, f"{stage}: the worker sent a malformed "
                               f"answer ({why}); was kbench's worker code changed in the "
                               "submission's process?")) from None
        if isinstance(answer, protocol.Failed):
            raise Stop(verdicts.from_error(answer.error, stage, self.ctx.device.type,
                                           self.box.log_text()))
        return answer

    def load(self, sub: Submission, instantiate: bool, class_name: str = "ModelNew",
             compile: bool = False, stage: str = "load", shared_names: bool = False,
             spec: protocol.ModelSpec | None = None) -> protocol.Loaded:
        """Import the file (a build); with ``instantiate``, also build the model the first
        case runs (``spec``, else the context's load_spec), whose weights' checksums come
        back. ``shared_names``: see kbench.shared.protocol.Load. Given ``spec``, nothing of
        the trusted side's shared state is touched: loads may run side by side in threads
        (load_spec seeds torch's global generator and sets the problem's sizes)."""
        ctx = self.ctx
        limit = ctx.task.limits.build_s if not instantiate else ctx.task.limits.load_s
        return self.call(protocol.Load(
            path=str(sub.path.resolve()), module_name=f"kbench_submission_{_safe(sub.name)}",
            class_name=class_name, device=ctx.device.type,
            reference=str(ctx.task.reference_path),
            model=(spec or ctx.load_spec()) if instantiate else None,
            eval_mode=ctx.task.mode == "eval",
            compile=compile, shared_names=shared_names), limit, stage)

    def samples(self, params: Params, rounds: int = 1, keep: bool = False) -> protocol.Samples:
        """One round of timing of one case; the worker draws the inputs from secret seeds
        and, with ``keep``, holds some outputs for kbench.grading.timing.integrity.verify."""
        ctx, case = self.ctx, params_text(params)
        dtype = ctx.task.benchmark_dtype
        timing = ctx.timing(rounds, again=case in self.timed)
        self.timed.add(case)
        answer = self.call(protocol.Time(params=params, dtype=dtype,
                                         distribution=ctx.distribution,
                                         model=ctx.spec(params, dtype), timing=timing,
                                         keep=keep),
                           ctx.task.limits.benchmark_s, f"benchmark {case}")
        return answer.samples


    def warm(self, params: Params, request: protocol.Warm) -> None:
        """The first round's warm-up of case ``params`` done now, ahead (``request``: made
        by Context.warm_request on the trusted side's thread), while nothing is timed beside
        it: the round then takes the short warm-up of a process that has timed the case."""
        case = params_text(params)
        self.call(request, self.ctx.task.limits.benchmark_s, f"benchmark {case} (warm-up)")
        self.timed.add(case)


class Ahead:
    """A worker readied ahead of its turn: started here (its pid known at once, so that it can
    be frozen), on the spare cores where the run has them (kbench.grading.context.Spare; else
    on this thread's), and readied by ``steps`` in a thread of its own while this one goes
    on; ``take`` waits for them and puts it on this thread's cores. A failure is kept and
    raised by ``take`` as the Stop it was."""

    def __init__(self, ctx: Context, log_name: str, env: dict[str, str],
                 steps: list[Callable[[Channel], object]]) -> None:
        self.channel = Channel(ctx, log_name, env, *((ctx.spare.cpus, ctx.spare.nice)
                                                      if ctx.spare else ()))
        self.done = [threading.Event() for _ in steps]
        self.failure: Stop | None = None
        self.thread = threading.Thread(target=self._ready, args=(steps,), daemon=True)
        self.thread.start()

    def _ready(self, steps: list[Callable[[Channel], object]]) -> None:
        try:
            for step, done in zip(steps, self.done, strict=True):
                step(self.channel)
                done.set()
        except Stop as stop:
            self.failure = stop
        except Exception as exc:  # kbench's own failure: the worker is of no use
            self.failure = Stop(Verdict(Status.INTERNAL_ERROR, f"kbench failed: {exc!r}"))
        finally:
            for done in self.done:
                done.set()

    def wait(self, step: int) -> None:
        """Until step ``step`` is done (or the steps failed)."""
        self.done[step].wait()

    def take(self) -> Channel:
        self.thread.join()
        if self.failure is not None:
            self.channel.close()
            raise self.failure
        self.channel.place(tuple(sorted(os.sched_getaffinity(0))))
        return self.channel

    def close(self) -> None:
        """Ended, readied or not (its thread ends with the worker's death)."""
        self.channel.box.kill()
        self.thread.join()
        self.channel.close()


def _last_output(log: str, lines: int = 3) -> str:
    """A crashed worker's last few lines of output, for its reason."""
    tail = [line.strip() for line in log.splitlines() if line.strip()][-lines:]
    return f"; its last output: {' | '.join(tail)}"[:400] if tail else "; it printed nothing"


def _safe(name: str) -> str:
    """A submission's name as part of a module name."""
    return "".join(ch if ch.isalnum() else "_" for ch in name)
