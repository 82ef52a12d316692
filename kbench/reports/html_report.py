"""index.html: a run as one self-contained page that opens offline. Charts are inline SVG
(charts.py), the tables sort with a few lines of inline script, and nothing is fetched at
view time. Every text that comes from a submission or a problem is escaped."""

from __future__ import annotations

from collections import Counter
from html import escape
from pathlib import Path

from kbench.grading.options import profile_text
from kbench.reports import charts
from kbench.reports.markdown import labels
from kbench.reports.summary import (
    INCONCLUSIVE,
    THRESHOLDS,
    degenerate_counts,
    inconclusive,
    not_run,
    rank_key,
    summarise,
)
from kbench.results.run_record import Benchmark, ProblemRun, RunResult, SubmissionResult, ms_text
from kbench.results.verdict import Status

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;
color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0}td,th{padding:.25em .6em;border-bottom:1px solid
#eee;text-align:left;vertical-align:top}th{background:#f6f6f6}
table.sortable th{cursor:pointer}table.sortable th:after{content:" \\2195";color:#aaa}
.num{text-align:right;font-variant-numeric:tabular-nums}
.v{display:inline-block;padding:0 .45em;border-radius:3px;color:#fff;font-size:.85em}
.ok{background:#2a7d2a}.wrong_output,.flagged{background:#b02a2a}.task_error,
.environment_error,.internal_error,.infrastructure_error{background:#777}.build_error,
.runtime_error,.crashed,.timeout,.out_of_memory,.cuda_error,.import_error{background:#c77a00}
.skipped{background:#5b7fa6}
.warn{background:#fff4d6;border:1px solid #e0c060;padding:.6em 1em}
.grid td{padding:1px}.grid .v{width:1.1em;height:1.1em;padding:0}
figure{margin:.5em 0}svg{max-width:100%;height:auto}p,td{overflow-wrap:break-word}
code{background:#f3f3f3;padding:0 .3em}.muted{color:#777}
"""
# Per-problem charts are drawn for runs of up to this many problems (each is tens of KB).
CHARTED_PROBLEMS = 40
_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var down = th.dataset.dir !== "down";
      th.dataset.dir = down ? "down" : "up";
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v || a.cells[col].textContent;
        var y = b.cells[col].dataset.v || b.cells[col].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
        return down ? -c : c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
document.body.dataset.ready = String(document.querySelectorAll("figure svg").length);
"""


def page(run: RunResult, histories: dict[str, list[dict]] | None = None) -> str:
    """The whole page; ``histories`` (submission name -> kbench.results.store.Store.history rows)
    adds a chart for each submission graded in more than one stored run."""
    title = f"kbench: {run.task}"
    parts = [f"<h1>{escape(title)}</h1>", _header(run), _verdicts(run)]
    if len(run.problems) > 1:
        parts.append(_batch(run))
    parts.append(_leaderboard(run))
    drawn = len(run.problems) <= CHARTED_PROBLEMS
    if not drawn:
        parts.append(f"<p class=muted>Charts per problem are drawn for runs of up to "
                     f"{CHARTED_PROBLEMS} problems, so that this page stays quick to open; "
                     "results.csv has every figure.</p>")
    for problem in run.problems:
        parts.append(_problem(run, problem,
                              [s for s in run.submissions if s.problem == problem.name], drawn))
    parts.append(_histories(histories or {}))
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width'><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}"
            f"<script>{_SCRIPT}</script></body></html>\n")


def _verdict(status: Status | str) -> str:
    value = status.value if isinstance(status, Status) else status
    return f"<span class='v {escape(value)}'>{escape(value)}</span>"


def _figure(fig) -> str:
    return f"<figure>{charts.svg(fig)}</figure>" if fig is not None else ""


def _header(run: RunResult) -> str:
    env = run.environment
    warn = ""
    if env.get("problems"):
        warn = ("<div class=warn><b>This machine has environment problems</b> (submissions "
                "they prevented are <code>environment_error</code>, not their fault):<ul>"
                + "".join(f"<li>{escape(str(p))}</li>" for p in env["problems"])
                + "</ul></div>")
    if skipped := not_run(run):
        warn += f"<p class=warn><b>Not run here</b>: {escape(skipped)}</p>"
    line = (f"{escape(str(env.get('device_name', env.get('device'))))} · torch "
            f"{escape(str(env.get('torch')))} · kbench {escape(run.kbench_version)} · run "
            f"{run.run_id} · seed {run.seed} · started {escape(run.started)} · timing "
            f"{escape(run.timing_mode)} · profile {escape(run.profile)} "
            f"({escape(profile_text(run.profile))})"
            + (f" · copy {run.copy_gbps:.0f} GB/s" if run.copy_gbps else ""))
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>"
                   for k, v in env.items())
    notes = "".join(f"<li>{escape(n)}</li>" for n in run.notes)
    return (f"{warn}<p>{line}</p><details><summary>environment and settings</summary>"
            f"<table>{rows}</table></details>" + (f"<ul>{notes}</ul>" if notes else ""))


def _verdicts(run: RunResult) -> str:
    counts = Counter(s.status.value for s in run.submissions)
    return "<p>" + " ".join(f"{_verdict(v)} {n}" for v, n in counts.most_common()) + "</p>"


def _batch(run: RunResult) -> str:
    """Many problems: the summary numbers, fast_p curves and a grid of verdicts."""
    s = summarise(run)
    table = "".join(
        f"<tr><td>{label}</td>" + "".join(
            f"<td class=num>{f'{100 * values[p]:.1f}%' if values else 'not timed'}</td>"
            for p in THRESHOLDS) + "</tr>"
        for label, values in (("vs eager, lower bound > p", s.fast),
                              ("vs eager, median > p (KernelBench; inconclusive timings not "
                               "counted)", s.fast_plain),
                              ("vs torch.compile, lower bound > p", s.fast_compile),
                              ("vs eager as KernelBench times (mean of its trials) > p",
                               s.fast_kernelbench)))
    head = "".join(f"<th>p={p:g}</th>" for p in THRESHOLDS)
    geo = f"{s.geomean:.3f}x" if s.geomean else "-"
    grid = "".join(
        f"<tr><td>{escape(problem.name)}"
        + (f" <span class=muted title='{escape(problem.degenerate)}'>(degenerate)</span>"
           if problem.degenerate else "") + "</td><td>"
        + ("".join(f"<span class='v {sub.status.value}' title='{escape(sub.name)}: "
                   f"{escape(sub.status.value)}{_said(sub.reason)}'></span> "
                   for sub in run.submissions if sub.problem == problem.name)
           if not problem.error else
           f"<span class=muted>problem error: {escape(_short(problem.error, 160))}</span>")
        + "</td></tr>" for problem in run.problems)
    return (f"<h2>Summary</h2><p>{s.problems} problems graded ({s.problem_errors} could not "
            f"be{escape(s.apart())}), {s.submissions} submissions; correct on "
            f"{s.correct}/{s.problems} "
            f"({100 * s.correct_rate:.0f}%); geometric-mean speedup of each problem's best: "
            f"{geo}</p>{_inconclusive(s.inconclusive)}"
            f"<table><tr><th>fast_p</th>{head}</tr>{table}</table>"
            f"{_figure(charts.fast_p(run))}<h3>Verdicts per problem</h3>"
            f"<table class=grid>{grid}</table>")


def _inconclusive(names: list[str]) -> str:
    if not names:
        return ""
    return (f"<p class=warn><b>Timings inconclusive</b> for {len(names)} correct "
            f"submission(s) (95 % interval wider than a factor of {INCONCLUSIVE:g}: the host "
            "was busy, or the sizes are too small to time here; ranked after clear figures by "
            "their lower bound, left out of the median-based fast_p and the geometric mean): "
            f"{escape(', '.join(names))}</p>")


def _leaderboard(run: RunResult) -> str:
    many = len(run.problems) > 1
    rows = []
    for sub in sorted(run.submissions, key=lambda s: (s.status is not Status.OK,
                                                      rank_key(s))):
        low = (sub.speedup_ci or [sub.speedup])[0] if sub.speedup else None
        share, doubt = sub.custom_share, inconclusive(sub)
        speed = _x(sub.speedup, sub.speedup_ci)
        rows.append(
            "<tr>" + (f"<td>{escape(sub.problem)}</td>" if many else "")
            + f"<td><a href='#{_anchor(sub)}'>{escape(sub.name)}</a></td>"
            f"<td data-v='{escape(sub.status.value)}' title='{escape(sub.reason)}'>"
            f"{_verdict(sub.status)}</td>"
            f"<td>{escape(sub.backend or '-')}</td>"
            + (f"<td class=num data-v='{low}' title='{escape(doubt)}'>not measurable "
               f"here: {speed}</td>" if doubt else
               f"<td class=num data-v='{sub.speedup or 0}'>{speed}</td>")
            + f"<td class=num data-v='{low or 0}'>{f'{low:.3f}x' if low else '-'}</td>"
            f"<td class=num data-v='{sub.compile_speedup or 0}'>"
            f"{_x(sub.compile_speedup, sub.compile_speedup_ci)}</td>"
            f"<td class=num>{sub.cases_passed}/{sub.cases_total}</td>"
            f"<td class=num data-v='{-1 if share is None else share}' "
            f"title='{escape('; '.join(sub.kernels))}'>"
            f"{'-' if share is None else f'{share:.0%}'}</td>"
            f"<td>{escape(', '.join(labels(sub)))}</td></tr>")
    head = ("<th>problem</th>" if many else "") + (
        "<th>submission</th><th>verdict</th><th>backend</th><th>speedup (95 % interval)</th>"
        "<th>lower bound"
        "</th><th>vs compile</th><th>cases</th><th>own kernels</th><th>flags</th>")
    return (f"<h2>Leaderboard</h2><table class=sortable><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _problem(run: RunResult, problem: ProblemRun, subs: list[SubmissionResult],
             drawn: bool) -> str:
    """One problem: notes, charts, each submission's sizes, and what failed and why."""
    out = [f"<h2 id='p-{escape(problem.name)}'>{escape(problem.name)}</h2>"]
    if problem.error:
        return out[0] + f"<p><b>Problem error</b>: {escape(problem.error)}</p>"
    if problem.notes:
        out.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in problem.notes) + "</ul>")
    if problem.degenerate:
        out.append(f"<p class=warn><b>Degenerate</b> ({escape(degenerate_counts(run))}): "
                   f"{escape(problem.degenerate)}</p>")
    device = str(run.environment.get("device_name", ""))
    out.append(_reference(problem))
    if drawn:
        out.append(_figure(charts.speedups(subs)))
        out.append(_figure(charts.roofline(subs, problem, device, run.copy_gbps)))
    for sub in subs:
        out.append(_submission(sub))
    return "".join(out)


def _submission(sub: SubmissionResult) -> str:
    head = (f"<h3 id='{_anchor(sub)}'>{escape(sub.name)} {_verdict(sub.status)}</h3>"
            f"<p class=muted>{escape(sub.path)} · sha256 {escape(sub.sha256[:12])}"
            + (f" · build {sub.build_s:.1f} s" if sub.build_s else "") + "</p>")
    logs = _logs(sub.logs)
    if sub.status is not Status.OK:
        reproduce = (sub.failure or {}).get("reproduce")
        return (head + f"<p>{escape(sub.reason)}</p>"
                + (f"<p>reproduce: <code>{escape(reproduce)}</code></p>" if reproduce else "")
                + (f"<p>logs: {logs}</p>" if logs else ""))
    rows = "".join(_size_row(b) for b in sub.benchmarks)
    return (head + "<table><tr><th>size</th><th>dtype</th><th>speedup</th><th>vs compile</th>"
            "<th>median</th><th>reference</th><th>GB/s</th></tr>" + rows + "</table>"
            + (f"<p>logs: {logs}</p>" if logs else ""))


def _logs(paths: list[str]) -> str:
    """Links to a submission's logs, relative to the page (they lie in logs/ beside it):
    the build and run logs, and how many more (one per fresh round)."""
    names = [Path(p).name for p in paths]
    main = [n for n in names if n.endswith((".build.log", ".run.log"))]
    more = len(names) - len(main)
    return " ".join(f"<a href='logs/{escape(n)}'>{escape(n)}</a>" for n in main) + (
        f" <span class=muted>and {more} more in logs/</span>" if more else "")


def _reference(problem: ProblemRun) -> str:
    rows = "".join(
        f"<tr><td>{escape(_params(b))}</td><td>{escape(b.dtype)}</td>"
        f"<td class=num>{ms_text(b.reference)}</td><td class=num>{ms_text(b.compiled)}</td>"
        f"<td class=num>{b.reference.gbps or 0:.0f}</td><td>{escape(b.drift or b.skipped or '')}"
        "</td></tr>" for b in problem.reference if b.reference is not None)
    return ("<table><tr><th>reference: size</th><th>dtype</th><th>eager median</th><th>"
            "torch.compile</th><th>GB/s</th><th>note</th></tr>" + rows + "</table>"
            if rows else "")


def _size_row(b: Benchmark) -> str:
    if b.skipped:
        return (f"<tr><td>{escape(_params(b))}</td><td>{escape(b.dtype)}</td>"
                f"<td colspan=5>skipped: {escape(b.skipped)}</td></tr>")
    ms, ref = ms_text(b.candidate), ms_text(b.reference)
    gbps = f"{b.candidate.gbps:.0f}" if b.candidate and b.candidate.gbps else "-"
    return (f"<tr><td>{escape(_params(b))}</td><td>{escape(b.dtype)}</td>"
            f"<td class=num>{_x(b.speedup, b.speedup_ci)}</td>"
            f"<td class=num>{_x(b.compile_speedup, b.compile_speedup_ci)}</td>"
            f"<td class=num>{ms}</td><td class=num>{ref}</td><td class=num>{gbps}</td></tr>")


def _histories(histories: dict[str, list[dict]]) -> str:
    figures = [(name, charts.history(name, rows)) for name, rows in sorted(histories.items())]
    figures = [(name, fig) for name, fig in figures if fig is not None]
    if not figures:
        return ""
    return "<h2>History across stored runs</h2>" + "".join(_figure(f) for _, f in figures)


def _params(b: Benchmark) -> str:
    return ", ".join(f"{k}={v}" for k, v in b.params.items())


def _anchor(sub: SubmissionResult) -> str:
    return escape(f"s-{sub.problem}-{sub.name}".replace(" ", "_"))


def _x(value: float | None, ci: list[float] | None) -> str:
    if not value:
        return "-"
    return f"{value:.3f}x" + (f" <span class=muted>({ci[0]:.3g}-{ci[1]:.3g})</span>"
                              if ci else "")


def _said(reason: str) -> str:
    """A verdict's reason after its name in a tooltip (escaped)."""
    return escape(f" - {_short(reason, 160)}") if reason else ""


def _short(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
