"""What ran on the GPU: one profiled call per timed size (kbench.worker.kernels), its kernels
sorted into the submission's own and torch's libraries', and the share of GPU time in its
own. Under ``--require-custom-kernels`` a submission whose time is mostly library kernels,
or that launched none of its own, is flagged with the kernels named."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kbench.grading.channel import Channel, Stop
from kbench.grading.context import Context
from kbench.problems.task import Params
from kbench.results.run_record import SubmissionResult, params_text
from kbench.results.verdict import Status, Verdict
from kbench.shared import protocol

# Kernels of torch and the libraries it calls, by name, whatever op launched them (a
# submission may call them from C++ without going through an operator), matched on the name
# without its template arguments and parameters (where a submission's own kernel names
# c10::Half or an at:: accessor): ATen, c10, CUB and Thrust, cuBLAS (gemv, gemmSN,
# splitKreduce, nvjet, xmma), cuDNN, torch's flash attention, Inductor's generated Triton,
# copies and fills; and cuBLAS's CUTLASS instances (cutlass::Kernel<cutlass_80_...>).
_LIBRARY = re.compile(
    r"^(at|at_cuda_detail|c10|cub|thrust|cudnn|cublas\w*|pytorch_flash)::|"
    r"^(sm\d+_xmma|xmma_|nvjet_|gemv|gemmSN|gemmk|splitKreduce|ampere_|volta_|turing_|"
    r"hopper_|cudnn|fmha|triton_(poi|red|per|tem|for)_|Memcpy|Memset)")
_CUBLAS_CUTLASS = re.compile(r"^(void )?cutlass::Kernel\d*<cutlass_\d+_")

# Own kernels must make up at least this share of the GPU time under the policy.
_MOSTLY = 0.5
_NAMED = 4  # kernels named in results and reasons


@dataclass(frozen=True)
class Share:
    own_us: float
    library_us: float
    kernels: list[str]  # the longest-running, "own 97%: name" or "library 3%: name"

    @property
    def share(self) -> float | None:
        total = self.own_us + self.library_us
        return self.own_us / total if total > 0 else None


def is_library(kernel: protocol.KernelRun) -> bool:
    """Launched inside one of torch's operators, or named as a library's kernel."""
    return kernel.op.startswith("aten::") or bool(_LIBRARY.match(short_name(kernel.name))) \
        or bool(_CUBLAS_CUTLASS.match(kernel.name))


def short_name(name: str) -> str:
    """A kernel's name without return type, template arguments or parameters."""
    name = name.removeprefix("void ").strip()
    depth, kept = 0, []
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            if ch == "(":
                break
            kept.append(ch)
        depth -= ch == ">" and depth > 0
    return "".join(kept).strip()[:120] or name[:120]


def classify(kernels: list[protocol.KernelRun]) -> Share:
    times: dict[tuple[bool, str], float] = {}
    for kernel in kernels:
        if math.isfinite(kernel.us) and kernel.us > 0:
            key = (not is_library(kernel), short_name(kernel.name))
            times[key] = times.get(key, 0.0) + kernel.us
    own = sum(t for (mine, _), t in times.items() if mine)
    total = sum(times.values())
    top = sorted(times.items(), key=lambda item: -item[1])[:_NAMED]
    named = [f"{'own' if mine else 'library'} {t / total:.0%}: {name}"
             for (mine, name), t in top] if total > 0 else []
    return Share(own, total - own, named)


def profiled(ctx: Context, channel: Channel, sizes: list[Params]
             ) -> list[protocol.KernelRun] | str:
    """What ran in one profiled call at each of ``sizes`` (the worker draws the inputs, as
    for timing), in a process of the submission that passed its cases or is being checked;
    why it could not be profiled (the profiler, a process that dies, memory), if so."""
    kernels: list[protocol.KernelRun] = []
    dtype = ctx.task.benchmark_dtype
    for params in sizes:
        request = protocol.Profile(params=params, dtype=dtype, distribution=ctx.distribution,
                                   model=ctx.spec(params, dtype))
        try:
            answer = channel.call(request, ctx.task.limits.case_s,
                                  f"kernels at {params_text(params)}")
        except Stop as stop:
            return stop.verdict.reason
        kernels += answer.kernels
    return kernels


def judge(ctx: Context, result: SubmissionResult, ran: list[protocol.KernelRun] | str
          ) -> None:
    """The share and the kernels of what ``profiled`` saw into ``result``, once the
    submission passed every case and timing; the policy's verdict is a Stop. What could not
    be profiled leaves the share unknown, which only the policy refuses."""
    if isinstance(ran, str):
        _unknown(ctx, result, ran)
        return
    share = classify(ran)
    if share.share is None:  # a correct call ran nothing on the device: no profiler here
        _unknown(ctx, result, "the profiler saw no kernel, copy or fill")
        return
    result.custom_share, result.kernels = share.share, share.kernels
    if ctx.options.require_custom_kernels and share.share < _MOSTLY:
        raise Stop(Verdict(Status.FLAGGED, f"custom kernels required: its own kernels ran "
                           f"{share.share:.0%} of its GPU time ({'; '.join(share.kernels)})"))


def _unknown(ctx: Context, result: SubmissionResult, why: str) -> None:
    result.flags.append(f"kernels not profiled ({why[:200]})")
    if ctx.options.require_custom_kernels:
        raise Stop(Verdict(Status.FLAGGED, f"custom kernels required, and what ran could not "
                           f"be profiled: {why[:200]}"))
