"""A run's charts, drawn with matplotlib: inline SVG for index.html and PNG beside the Markdown
leaderboard. Figures are made without pyplot's global state, so nothing is left open between
runs. Each function returns None where the run has nothing to draw (no timed submission)."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # no display: files only

from matplotlib.figure import Figure  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from kbench.host.peaks import peak_tflops  # noqa: E402
from kbench.reports.summary import best_per_problem, inconclusive  # noqa: E402
from kbench.results.run_record import (  # noqa: E402
    Benchmark,
    ProblemRun,
    RunResult,
    SubmissionResult,
    params_text,
)
from kbench.results.verdict import Status  # noqa: E402

# A chart shows at most this many submissions (the best, by speedup); tables show them all.
MOST = 12
_STYLE = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
          "axes.spines.right": False}


def svg(fig: Figure) -> str:
    """The figure as an <svg> element (text kept as text: small, and searchable)."""
    with matplotlib.rc_context(_STYLE):
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def png_bytes(fig: Figure) -> bytes:
    with matplotlib.rc_context(_STYLE):
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def _figure(width: float = 7.0, height: float = 3.2) -> Figure:
    with matplotlib.rc_context(_STYLE):
        return Figure(figsize=(width, height), layout="constrained")


def _timed(subs: list[SubmissionResult]) -> list[SubmissionResult]:
    ok = [s for s in subs if s.status is Status.OK and any(b.speedup for b in s.benchmarks)]
    return sorted(ok, key=lambda s: -(s.speedup or 0))[:MOST]


def speedups(subs: list[SubmissionResult]) -> Figure | None:
    """Per benchmark size, each timed submission's speedup over eager with its 95 % interval
    (filled marker) and over torch.compile (hollow), on a log scale around 1x."""
    timed = _timed(subs)
    if not timed:
        return None
    shapes = list(dict.fromkeys(params_text(b.params) for s in timed for b in s.benchmarks))
    fig = _figure(max(5.0, 1.2 + 0.5 * len(shapes) * max(1, len(timed)) ** 0.5))
    ax = fig.add_subplot()
    width = 0.8 / len(timed)
    for i, sub in enumerate(timed):
        xs, ys, errs, cxs, cys = [], [], [[], []], [], []
        for b in sub.benchmarks:
            x = shapes.index(params_text(b.params)) - 0.4 + width * (i + 0.5)
            if b.speedup:
                low, high = b.speedup_ci or (b.speedup, b.speedup)
                xs.append(x)
                ys.append(b.speedup)
                errs[0].append(b.speedup - low)
                errs[1].append(high - b.speedup)
            if b.compile_speedup:
                cxs.append(x)
                cys.append(b.compile_speedup)
        line = ax.errorbar(xs, ys, yerr=errs, fmt="o", ms=5, capsize=2, label=sub.name)
        ax.plot(cxs, cys, "o", ms=5, mfc="none", color=line[0].get_color())
    ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
    _log_axis(ax.yaxis, "x")
    ax.set_xticks(range(len(shapes)), shapes, rotation=20 if len(shapes) > 3 else 0)
    ax.set_ylabel("speedup (x, log)")
    ax.set_title("speedup over eager (filled, 95 % interval) and torch.compile (hollow)")
    ax.legend(fontsize=7, ncols=2 if len(timed) > 6 else 1, loc="best")
    return fig


def roofline(subs: list[SubmissionResult], problem: ProblemRun, device: str,
             copy_gbps: float | None) -> Figure | None:
    """Achieved TFLOP/s against arithmetic intensity under the measured copy bandwidth and the
    device's peak; for work without matrix FLOPs, achieved GB/s against the copy bandwidth."""
    timed = _timed(subs)
    points = [(sub.name, b) for sub in timed for b in sub.benchmarks
              if b.candidate is not None and b.candidate.gbps]
    points += [("reference", b) for b in problem.reference
               if b.reference is not None and b.reference.gbps]
    if not points:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    if all(b.flops and b.nbytes for _, b in points):
        _flops_roof(ax, points, device, copy_gbps)
    else:
        _bandwidth_dots(ax, points, copy_gbps)
    return fig


def _log_axis(axis, unit: str = "") -> None:
    """A log scale labelled in plain numbers (2x, 0.5x), not powers of ten; the minor ticks
    too where the data spans less than a decade (else they crowd)."""
    axis.axes.set_xscale("log") if axis.axis_name == "x" else axis.axes.set_yscale("log")
    label = FuncFormatter(lambda v, _: f"{v:g}{unit}")
    axis.set_major_formatter(label)
    low, high = axis.get_view_interval()
    axis.set_minor_formatter(label if high < 10 * low else NullFormatter())


def _measured(name: str, b: Benchmark):
    return b.reference if name == "reference" else b.candidate


def _flops_roof(ax, points: list[tuple[str, Benchmark]], device: str,
                copy_gbps: float | None) -> None:
    names = list(dict.fromkeys(name for name, _ in points))
    for name in names:
        mine = [b for n, b in points if n == name]
        ax.plot([b.flops / b.nbytes for b in mine],
                [b.flops / (_measured(name, b).ms * 1e-3) / 1e12 for b in mine],
                "s" if name == "reference" else "o", label=name)
    intensity = [b.flops / b.nbytes for _, b in points]
    low, high = min(intensity) / 4, max(intensity) * 4
    dtype = points[0][1].dtype
    peak = peak_tflops(device, dtype)
    if copy_gbps:
        xs = [low * (high / low) ** (k / 50) for k in range(51)]
        ys = [min(x * copy_gbps / 1e3, peak or math.inf) for x in xs]
        ax.plot(xs, ys, color="0.3", lw=1, label=f"roof: copy {copy_gbps:.0f} GB/s"
                + (f", peak {peak:g} TFLOP/s ({dtype})" if peak else ""))
    _log_axis(ax.xaxis)
    _log_axis(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved at least)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("roofline")
    ax.legend(fontsize=7)


def _bandwidth_dots(ax, points: list[tuple[str, Benchmark]], copy_gbps: float | None) -> None:
    shapes = list(dict.fromkeys(params_text(b.params) for _, b in points))
    names = list(dict.fromkeys(name for name, _ in points))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        mine = [b for n, b in points if n == name]
        ax.plot([shapes.index(params_text(b.params)) - 0.4 + width * (i + 0.5) for b in mine],
                [_measured(name, b).gbps for b in mine],
                "s" if name == "reference" else "o", ms=5, label=name,
                color="0.4" if name == "reference" else None)
    if copy_gbps:
        ax.axhline(copy_gbps, color="C3", lw=1, ls="--", label=f"copy {copy_gbps:.0f} GB/s")
    ax.set_xticks(range(len(shapes)), shapes, rotation=20 if len(shapes) > 3 else 0)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("achieved GB/s")
    ax.set_title("bandwidth (the fewest bytes a call must move, over its median time)")
    ax.legend(fontsize=7, ncols=2 if len(names) > 6 else 1)


def fast_p(run: RunResult) -> Figure | None:
    """Share of gradable problems with a correct submission faster than p, for p from 0 to
    the largest speedup: on the interval's lower bound (kbench), on the median (KernelBench's
    fast_p) and on the lower bound against torch.compile."""
    winners = best_per_problem(run)
    if len(winners) < 2 or not any(w and w.speedup for w in winners.values()):
        return None
    top = max(max(w.speedup or 0.0, w.compile_speedup or 0.0) for w in winners.values() if w)
    ps = [top * 1.05 * k / 200 for k in range(201)]
    curves = {
        "lower bound, vs eager": lambda w: (w.speedup_ci or [w.speedup or 0.0])[0],
        "median, vs eager (KernelBench's fast_p; inconclusive not counted)":
            lambda w: 0.0 if inconclusive(w) else (w.speedup or 0.0),
        "lower bound, vs torch.compile": lambda w: (w.compile_speedup_ci
                                                    or [w.compile_speedup or 0.0])[0],
    }
    fig = _figure(6.0, 3.0)
    ax = fig.add_subplot()
    for label, value in curves.items():
        shares = [sum(1 for w in winners.values() if w and (p == 0 or (value(w) or 0.0) > p))
                  / len(winners) for p in ps]
        ax.step(ps, shares, where="post", label=label)
    ax.axvline(1.0, color="0.5", lw=0.8, ls="--")
    ax.set_xlabel("p (speedup)")
    ax.set_ylabel("share of problems")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"fast_p over {len(winners)} problems")
    ax.legend(fontsize=7)
    return fig


def history(name: str, rows: list[dict]) -> Figure | None:
    """A submission's speedup across the stored runs it was graded in (two or more)."""
    timed = [r for r in rows if r["speedup"]]
    if len(rows) < 2 or not timed:
        return None
    fig = _figure(4.5, 2.2)
    ax = fig.add_subplot()
    ax.plot([r["run"] for r in timed], [r["speedup"] for r in timed], "o-")
    failed = [r["run"] for r in rows if r["status"] != Status.OK.value]
    if failed:
        ax.plot(failed, [min(r["speedup"] for r in timed)] * len(failed), "x", color="C3",
                label="not correct")
        ax.legend(fontsize=7)
    ax.set_xlabel("run")
    ax.set_ylabel("speedup (x)")
    ax.set_title(name)
    return fig
