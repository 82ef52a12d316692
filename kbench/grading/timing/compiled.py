"""torch.compile of the reference, the second baseline: compiled ahead on the spare cores where
the run has them (kbench.grading.context.Spare), one untimed call per benchmark case while the
problem's submissions are graded, then timed on the timing cores when the problem closes;
compiled and timed in one go where it has none. On an H100 the compile took 15-22 s of the
grading per problem, most of it on the host (torch's compiler's imports and code generation):
a one-GPU run graded nothing meanwhile."""

from __future__ import annotations

from kbench.grading.channel import Ahead, Channel, Stop
from kbench.grading.context import Context
from kbench.sandbox import child_env
from kbench.shared import protocol
from kbench.shared.protocol import Samples

_STAGE = "torch.compile of the reference"


class Compiled:
    """``skips``: per benchmark case, why it is not timed here (kbench.grading.timing.
    reference_pool.unfit), shared with the reference pool."""

    def __init__(self, ctx: Context, log: str, skips: list[str | None]) -> None:
        self.ctx, self.log, self.skips = ctx, log, skips
        self.ahead: Ahead | None = None

    def start(self) -> None:
        """Compile ahead where the run has spare cores (else ``time`` compiles)."""
        ctx = self.ctx
        if ctx.spare is None or self.ahead is not None:
            return
        spec = ctx.load_spec()  # here: it binds the problem's sizes (see Channel.load)
        warms = [self._warm(i) for i, skip in enumerate(self.skips) if skip is None]
        self.ahead = Ahead(ctx, f"{self.log}.compile.run.log", self._env(), [
            lambda channel: channel.load(ctx.reference_file, True, "Model", compile=True,
                                         spec=spec), *warms])

    def _env(self) -> dict[str, str]:
        """Compiler caches of its own (kept for the problem's next run): readied ahead, the
        process is stopped while anything is timed, and must not hold a lock of the caches a
        submission's own torch.compile or Triton uses then. Compiled in its own process, not
        a pool of compile workers (the generated code is the same): on a busy 2-core machine
        a softmax's first compile took 17 s so, 35 s with the pool."""
        caches = self.ctx.options.cache_dir / "torch-compile" / self.log
        return child_env({"TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
                          "TRITON_CACHE_DIR": str(caches / "triton"),
                          "TORCHINDUCTOR_COMPILE_THREADS": "1"})

    def _warm(self, index: int):
        ctx = self.ctx
        params, dtype = ctx.benchmarks[index], ctx.task.benchmark_dtype
        request = protocol.Warm(params=params, dtype=dtype, distribution=ctx.distribution,
                                model=ctx.spec(params, dtype))
        return lambda channel: channel.call(request, ctx.task.limits.benchmark_s, _STAGE)

    def time(self) -> tuple[list[Samples | None], str | None]:
        """Each case timed (compiled first, where it was not ahead), and why it failed, if it
        did; the process ended."""
        ctx = self.ctx
        timings: list[Samples | None] = [None] * len(ctx.benchmarks)
        channel: Channel | None = None
        try:
            if self.ahead is not None:
                ahead, self.ahead = self.ahead, None
                channel = ahead.take()
            else:
                channel = Channel(ctx, f"{self.log}.compile.run.log", self._env())
                channel.load(ctx.reference_file, True, "Model", compile=True)
            for i, params in enumerate(ctx.benchmarks):
                if self.skips[i] is None:
                    timings[i] = channel.samples(params)
        except Stop as stop:
            return timings, stop.verdict.reason
        finally:
            if channel is not None:
                channel.close()
        return timings, None

    def close(self) -> None:
        """Ended where it was never timed."""
        if self.ahead is not None:
            self.ahead.close()
            self.ahead = None
